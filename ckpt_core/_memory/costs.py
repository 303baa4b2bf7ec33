"""FLOPs of a block's parts, counted as ``torch.utils.flop_counter.FlopCounterMode`` does.

Matrix multiplications only, 2 FLOPs per multiply-add, attention over the full
s x s (causal masking not discounted).  Each family composes its `BlockFlops`
from these; `ckpt_core._memory.flops` turns them into a tier's recompute ratio.

Pure arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.ledger import BlockMode, Step


@dataclass(frozen=True, slots=True)
class BlockFlops:
    """Forward FLOPs of one block: its attention module(s) and the whole block."""

    attention_linear: int
    attention_core: int
    other_linear: int
    attention_tail: int = 0  # not recomputed when the attention module is the region
    block_tail: int = 0  # not recomputed when the block is the region

    @property
    def attention(self) -> int:
        return self.attention_linear + self.attention_core

    @property
    def total(self) -> int:
        return self.attention + self.other_linear

    def recomputed(self, mode: BlockMode) -> int:
        if mode == "full":
            return self.total - self.block_tail
        if mode == "selective":
            return self.attention - self.attention_tail
        return 0


def core_flops(arch: Arch, step: Step) -> int:
    """q @ k^T and probabilities @ v over the full s x s (v's heads may be narrower: MLA)."""
    return 2 * step.batch * arch.heads * step.seq * step.seq * (arch.head_dim + arch.value_dim)


def dense_mlp_flops(arch: Arch, step: Step) -> int:
    """A dense MLP's projections: up and down, plus gate when gated."""
    return 2 * step.tokens * arch.hidden * arch.intermediate * (3 if arch.glu else 2)


def lm_head_flops(arch: Arch, step: Step, *, transform: int = 0) -> int:
    """The LM head over every token (``transform``: weights of a dense layer before it)."""
    return 2 * step.tokens * (arch.hidden * arch.vocab + transform)


def attention_block_flops(
    arch: Arch,
    step: Step,
    *,
    mlp: int,
    attention_kept_after: bool,
    mlp_kept_after: bool,
    projections: tuple[int, int] | None = None,
) -> BlockFlops:
    """A block of q/k/v/o projections, attention and an MLP of ``mlp`` FLOPs.

    ``*_kept_after``: something after the region's last projection keeps a
    tensor (a dropout mask, a post-norm), so non-reentrant checkpoint
    recomputes that projection too.  ``projections``: the attention linears' FLOPs
    and o_proj's, when they are not q / k / v / o of the heads (MLA's latents).
    """
    t, h, q = step.tokens, arch.hidden, arch.heads * arch.head_dim
    kv = arch.kv_heads * arch.head_dim
    linears, output = projections or (2 * t * (h * (q + 2 * kv) + q * h), 2 * t * q * h)
    down = 2 * t * arch.intermediate * h
    return BlockFlops(
        linears,
        core_flops(arch, step),
        mlp,
        attention_tail=0 if attention_kept_after else output,
        block_tail=0 if mlp_kept_after else down,
    )
