"""How wrong each estimate can be, and whether a verdict survives it.

A fit's activation, non-torch and CUDA-graph figures are estimates unless measured. A verdict is
*borderline* when moving every estimated figure across its error band flips it: kvplan then says so and
names the measured figures (from a startup log, ``kvplan explain``) that would settle it.

The bands are the spread of the estimates on the calibration points (docs/calibration-points.md):
activation within 8% on dense V0 logs but 4x off on MoE/MLA and early V1 profiles; non-torch 0.03-0.35
GiB at tp 1 and 0.20-0.30 GiB with NCCL; CUDA graphs 17% apart on five points of two engine generations.
"""

from __future__ import annotations

import dataclasses

from kvplan.core.units import MiB

ACTIVATION_ERROR_FRAC = 0.5  # generous: the dense fit is within 8%, MoE/MLA and early-V1 profiles are not
NON_TORCH_ERROR_BYTES = 256 * MiB
CUDA_GRAPH_ERROR_FRAC = 0.5

FLAGS = {"activation": "--activation-memory", "non_torch": "--non-torch-memory", "cuda_graph": "--cuda-graph-memory"}


def shifted(req, result, direction: int):
    """``req`` with each estimated figure of ``result`` moved by its error band (+1 up, -1 down)."""
    b = result.breakdown
    changes = {}
    if "activation" in result.estimated:
        changes["activation_memory"] = max(0, round(b.activation * (1 + direction * ACTIVATION_ERROR_FRAC)))
    if "non_torch" in result.estimated:
        changes["non_torch_memory"] = max(0, b.non_torch + direction * NON_TORCH_ERROR_BYTES)
    if "cuda_graph" in result.estimated:
        changes["cuda_graph_memory"] = max(0, round(b.cuda_graph * (1 + direction * CUDA_GRAPH_ERROR_FRAC)))
    return dataclasses.replace(req, **changes) if changes else None
