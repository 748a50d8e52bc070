"""Hugging Face transformers' DynamicCache, by release: how an MLA layer is cached.

transformers 4.x stores DeepSeek-V2/V3's K and V expanded per head; 5.x stores the compressed latent
(kv_lora_rank + qk_rope_head_dim), checked byte for byte against transformers 5.23 on this machine
(tests/validate/test_hf_cache.py). Other layer kinds are cached the same way in both.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.core.profiles import EngineProfile, chain


@dataclass(frozen=True, kw_only=True)
class HFRules:
    mla_latent: bool


HF_PROFILES: tuple[EngineProfile, ...] = chain("hf", "transformers", [
    ("4.40", HFRules(mla_latent=False),
     ("DynamicCache stores MLA keys and values expanded per head (4.x: models/deepseek_v3/modeling_deepseek_v3.py)",)),
    ("5.0", HFRules(mla_latent=True),
     ("DynamicCache stores the MLA latent (kv_lora_rank + qk_rope_head_dim), checked byte for byte against the real "
      "cache (5.23: models/deepseek_v3/modeling_deepseek_v3.py; tests/validate/test_hf_cache.py)",)),
])
