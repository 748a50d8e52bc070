"""``ideal``: exactly the token states attention needs, nothing rounded, nothing kept early.

- full attention: every token; sliding window W: min(S, W) tokens; chunked-local with chunk C: the
  tokens of the current chunk, S - C * floor((S - 1) / C).
- MLA: the latent, kv_lora_rank + qk_rope_head_dim per token (DeepSeek-V2 paper, section 2.1).
- linear attention: conv state of kernel-1 columns (the kernel's past inputs) plus the recurrent state.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.core.engines.base import Engine


@dataclass(frozen=True, kw_only=True)
class IdealEngine(Engine):
    name: str = "ideal"
