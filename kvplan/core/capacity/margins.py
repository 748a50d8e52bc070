"""How wrong each estimate can be, and whether a verdict survives it.

A fit's activation, non-torch and CUDA-graph figures are estimates unless measured. A verdict is
*borderline* when moving every estimated figure across its error band flips it: kvplan then says so and
names the measured figures (from a startup log, ``kvplan explain``) that would settle it.

The bands are the estimates' measured errors on the calibration points (docs/calibration-points.md),
defined beside the estimates in kvplan/core/capacity/estimates.py. The activation band holds for dense
models; MoE and MLA models fall outside it (DeepSeek-V3 AWQ: 1.48 GiB predicted, 0.37 logged), so their
activation estimate gets a band wide enough to cover that miss. An engine whose activation is modelled from its
source states its own band in the fit's settings (``activation_band``: vLLM V1, kvplan/core/engines/vllm/
activation.py).
"""

from __future__ import annotations

import dataclasses

from kvplan.core.capacity.estimates import ACTIVATION_ERROR_FRAC, CUDA_GRAPH_ERROR_FRAC, NON_TORCH_ERROR_BYTES
from kvplan.core.spec import MLALayer

ACTIVATION_ERROR_FRAC_MOE_MLA = 0.75  # 1.48 GiB predicted vs 0.37 logged is 75% below the estimate

FLAGS = {"activation": "--activation-memory", "non_torch": "--non-torch-memory", "cuda_graph": "--cuda-graph-memory"}


def shifted(req, result, direction: int):
    """``req`` with each estimated figure of ``result`` moved by its error band (+1 up, -1 down)."""
    b = result.breakdown
    changes = {}
    spec = req.spec
    sparse = (spec.arch is not None and spec.arch.moe is not None) or any(isinstance(x, MLALayer) for x in spec.layers)
    band = ACTIVATION_ERROR_FRAC_MOE_MLA if sparse else ACTIVATION_ERROR_FRAC
    band = float(result.settings.get("activation_band", band))  # an engine's own band for its model of the peak
    if "activation" in result.estimated:
        changes["activation_memory"] = max(0, round(b.activation * (1 + direction * band)))
    if "non_torch" in result.estimated:
        changes["non_torch_memory"] = max(0, b.non_torch + direction * NON_TORCH_ERROR_BYTES)
    if "cuda_graph" in result.estimated:
        changes["cuda_graph_memory"] = max(0, round(b.cuda_graph * (1 + direction * CUDA_GRAPH_ERROR_FRAC)))
    return dataclasses.replace(req, **changes) if changes else None
