"""Hugging Face transformers' DynamicCache, by release.

- transformers 4.x stores DeepSeek-V2/V3's K and V expanded per head; 5.x stores the compressed latent
  (kv_lora_rank + qk_rope_head_dim), checked byte for byte against transformers 5.23 (tests/validate/).
- 5.24 keeps DeepSeek-V4's CSA overlap gates in float32: the compressors' ``position_bias`` became a float32
  parameter (``DeepseekV4CSACompressor.__init__``/``DeepseekV4Indexer.__init__``), and the gate it is added to
  (``chunk_gate + self.position_bias`` in ``forward``) is promoted before ``DeepseekV4CSACache.update_overlap_state``
  clones its last window into ``overlap_gate``; 5.23 created the parameter in the model dtype.

The byte-for-byte tests measure the installed transformers against its own profile (``hf==<installed>``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.core.profiles import EngineProfile, chain


@dataclass(frozen=True, kw_only=True)
class HFRules:
    mla_latent: bool  # MLA cached as the latent (True) or expanded per-head K and V (False)
    # DeepSeek-V4 CSA layers: the overlap gates (compressor's and indexer's) held in float32, whatever the model dtype
    csa_overlap_gate_fp32: bool = False


HF_PROFILES: tuple[EngineProfile, ...] = chain("hf", "transformers", [
    ("4.40", HFRules(mla_latent=False),
     ("DynamicCache stores MLA keys and values expanded per head (4.x: models/deepseek_v3/modeling_deepseek_v3.py)",)),
    ("5.0", HFRules(mla_latent=True),
     ("DynamicCache stores the MLA latent (kv_lora_rank + qk_rope_head_dim), checked byte for byte against the real "
      "cache (5.23: models/deepseek_v3/modeling_deepseek_v3.py; tests/validate/test_hf_cache.py)",)),
    ("5.24", HFRules(mla_latent=True, csa_overlap_gate_fp32=True),
     ("DeepSeek-V4's CSA overlap gates are held in float32: position_bias is a float32 parameter added to the gate "
      "before DeepseekV4CSACache.update_overlap_state keeps it (5.24: models/deepseek_v4/modeling_deepseek_v4.py, "
      "DeepseekV4CSACompressor and DeepseekV4Indexer)",)),
])
