"""Recompute cost per tier: (forward + backward FLOPs with the tier's recompute) / (without).

FLOPs are counted the way ``torch.utils.flop_counter.FlopCounterMode`` counts
them, so the ratio can be checked against it (see `ckpt_core._memory.costs`;
fused kernels' internal recomputation not counted).  Backward: each matmul's
input gradient and, for trained weights, its weight gradient (each as many
FLOPs as the forward); attention's backward is twice its forward.

Recompute adds the forward of what the tier checkpoints: every block (full),
every other block (medium), the attention modules (selective) - except a
region's last projection when nothing after it inside the region keeps a
tensor: non-reentrant checkpoint stops recomputing once every kept tensor is
back (``down_proj`` of a Llama block, ``o_proj`` of its attention).
FlopCounterMode does not count ``grouped_mm``, so for MoE experts the ratio
is this model's own.  Pure arithmetic.
"""

from __future__ import annotations

from ckpt_core._memory.activations import block_modes
from ckpt_core._memory.arch import Arch
from ckpt_core._memory.families import family_of
from ckpt_core._memory.ledger import Step
from ckpt_core._planning.tiers import ConcreteTier


def recompute_ratio(arch: Arch, step: Step, tier: ConcreteTier) -> float:
    """FLOPs of a training step with ``tier``'s recompute over those without."""
    family = family_of(arch)
    blocks = [
        (mode, family.block_flops(arch, step, family.block_kind(arch, stack, index)))
        for stack, index, mode in block_modes(arch, tier)
    ]
    linear = sum(b.attention_linear + b.other_linear for _, b in blocks)
    linear += family.head_flops(arch, step)
    core = sum(b.attention_core for _, b in blocks)
    weight_grads = linear if step.trainable_weights else 0
    base = (linear + core) + (linear + weight_grads + 2 * core)
    recompute = sum(b.recomputed(mode) for mode, b in blocks)
    return (base + recompute) / base
