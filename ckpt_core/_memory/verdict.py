"""The verdict on a peak against a budget: fits, tight or does not fit, and the margin.

The estimate's error on real steps is not zero, so a peak close to the budget
is answered ``tight`` rather than a bare ``fits``: the band is the worst
process-memory error ``bench/gpu_truth.py`` measures over the GPU rows,
per attention kernel, wider for families the replay does not run as their own
model.  Pure arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.attention import any_math_kernel
from ckpt_core._memory.families import family_of
from ckpt_core._memory.ledger import Step

GIB: Final = 1 << 30

# A peak within this fraction of the budget is `tight`: the estimate's error band on real
# steps, by attention kernel - the worst process-memory error bench/gpu_truth.py measures
# over the GPU rows (eager +14.9%, sdpa -5.5%: T4 QLoRA rows), rounded up.
TIGHT_BANDS: Final[dict[str, float]] = {"eager": 0.16, "fused": 0.06, "flash": 0.06}
# Families the replay does not run as their own forward (`Family.replayed_exactly`: MoE
# models) take the closed form's allocated peak and a stand-in's pool; against their
# real op order (bench/op_order.py) the pool is up to 7.7% low with sdpa: sdpa's band
# widens to cover that, eager's already does.
CLOSED_FORM_BANDS: Final[dict[str, float]] = {"eager": 0.16, "fused": 0.09, "flash": 0.09}


def tight_band(arch: Arch, step: Step) -> float:
    """The error band of this model's estimate with the step's attention kernel.  sdpa's
    math backend keeps score-sized buffers as eager does, whose segments one op order
    strands and a close one does not, and takes eager's band; no GPU row measures it
    (docs/memory-model.md)."""
    family = family_of(arch)
    kernel = "eager" if any_math_kernel(arch, step) else step.attention
    return (TIGHT_BANDS if family.replayed_exactly(arch) else CLOSED_FORM_BANDS)[kernel]


def verdict(peak: int, budget: int | None, band: float) -> dict[str, Any]:
    """``fits`` (peak <= budget), ``margin_bytes`` (budget - peak) and ``tight``.

    ``tight``: the peak is within the estimate's error band (``band``, a
    fraction of the peak) of the budget, on either side: the job may or may
    not fit; ``verdict`` says it in one word (``fits`` | ``tight`` |
    ``does_not_fit``).
    """
    if budget is None:
        return {"fits": None, "margin_bytes": None, "tight": None, "verdict": None}
    margin = budget - peak
    tight = abs(margin) <= band * peak
    word = "tight" if tight else "fits" if margin >= 0 else "does_not_fit"
    return {"fits": margin >= 0, "margin_bytes": margin, "tight": tight, "verdict": word}


def tight_note(row: Mapping[str, Any], band: float) -> str:
    """Say so when the peak is within the estimate's error band of the budget."""
    if not row.get("tight"):
        return ""
    margin = row["margin_bytes"]
    side = f"{_gib(margin)} to spare" if margin >= 0 else f"{_gib(-margin)} over"
    return (
        f" - TIGHT: {side}, within the estimate's {band:.0%} error band on real GPUs; "
        "the job may run out of memory: a longer-recompute tier, a smaller micro-batch or more "
        "headroom is safer"
    )


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.1f} GiB"
