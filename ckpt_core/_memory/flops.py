"""Recompute cost of an assignment: (forward + backward FLOPs with its recompute) / (without).

FLOPs are counted the way ``torch.utils.flop_counter.FlopCounterMode`` counts
them, so the ratio can be checked against it (see `ckpt_core._memory.costs`;
fused kernels' internal recomputation not counted).  Backward: each matmul's
input gradient and, for trained weights, its weight gradient (each as many
FLOPs as the forward); attention's backward is twice its forward.

Recompute adds the forward of what the assignment checkpoints - a full
block's forward, a selective block's attention modules - except a
region's last projection when nothing after it inside the region keeps a
tensor: non-reentrant checkpoint stops recomputing once every kept tensor is
back (``down_proj`` of a Llama block, ``o_proj`` of its attention).
FlopCounterMode does not count ``grouped_mm``, so for MoE experts the ratio
is this model's own.  Pure arithmetic.
"""

from __future__ import annotations

import functools

from ckpt_core._memory.activations import Assignment, block_kinds, mode_counts
from ckpt_core._memory.arch import Arch, BlockKind
from ckpt_core._memory.costs import BlockFlops
from ckpt_core._memory.families import family_of
from ckpt_core._memory.ledger import Step


def recompute_ratio(arch: Arch, step: Step, assignment: Assignment) -> float:
    """FLOPs of a training step with ``assignment``'s recompute over those without."""
    flops = kind_flops(arch, step)
    recompute = sum(
        count * flops[kind].recomputed(mode)
        for (mode, kind), count in mode_counts(arch, assignment)
    )
    base = base_flops(arch, step)
    return (base + recompute) / base


@functools.lru_cache(maxsize=1024)
def kind_flops(arch: Arch, step: Step) -> dict[BlockKind, BlockFlops]:
    """Forward FLOPs of one block of each kind (cached: pure function; do not mutate)."""
    family = family_of(arch)
    return {kind: family.block_flops(arch, step, kind) for kind, _ in block_kinds(arch)}


@functools.lru_cache(maxsize=1024)
def base_flops(arch: Arch, step: Step) -> int:
    """Forward + backward FLOPs of a training step without recompute."""
    flops = kind_flops(arch, step)
    linear = core = 0
    for kind, count in block_kinds(arch):
        linear += count * (flops[kind].attention_linear + flops[kind].other_linear)
        core += count * flops[kind].attention_core
    linear += family_of(arch).head_flops(arch, step)
    weight_grads = linear if step.trainable_weights else 0
    return (linear + core) + (linear + weight_grads + 2 * core)
