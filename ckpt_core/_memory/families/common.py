"""Op sequences that several families share (GPT-2, Falcon, GPT-NeoX, OPT, BERT): MLP, head,
masks, a rotary block's inputs, a dense block's FLOPs.

Pure arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable

from ckpt_core._memory.arch import Arch, BlockKind
from ckpt_core._memory.attention import mask_bytes, rope_tables
from ckpt_core._memory.costs import BlockFlops, attention_block_flops, dense_mlp_flops
from ckpt_core._memory.ledger import (
    GLOBAL,
    BlockMode,
    Ledger,
    Step,
    activation,
    causal_loss,
    linear,
    norm,
)


def hidden_elements(arch: Arch, step: Step) -> int:
    """Elements of one hidden-states tensor."""
    return step.tokens * arch.hidden


def two_matrix_mlp(led: Ledger, arch: Arch, step: Step, x: str, names: tuple[str, str]) -> str:
    """fc2(act(fc1(x))): returns the storage of fc2's output."""
    elements = step.tokens * arch.intermediate
    linear(led, step, x, arch.hidden, names[0])
    act = activation(led, step, "mlp.fc1", tag="mlp.act", kind=arch.act, elements=elements)
    linear(led, step, act, arch.intermediate, names[1])
    return "mlp.out"


def layer_norm_lm_head(arch: Arch, step: Step) -> Ledger:
    """Final LayerNorm, LM head, fp32 causal-LM loss (GPT-2, Falcon, GPT-NeoX, OPT)."""
    led = Ledger()
    out = norm(led, step, "in", "ln_f", kind="layer", rows=step.tokens, width=arch.hidden)
    linear(led, step, out, arch.hidden, "lm_head")
    causal_loss(led, step.tokens, arch.vocab)
    return led


def keep_mask(led: Ledger, step: Step, mask: str | None) -> None:
    """The mask a checkpointed region keeps as an input, if the model has one."""
    if mask is not None:
        led.keep(f"{GLOBAL}mask.{mask}", mask_bytes(step, mask))


def rotary_block_inputs(led: Ledger, arch: Arch, step: Step, mask: str | None) -> None:
    """What a checkpointed rotary block or attention keeps besides its hidden states: the
    cos / sin tables, the positions and the mask its recompute reads."""
    rope_tables(led, arch, step, sliding=False)
    led.keep(f"{GLOBAL}position_ids", 8 * step.seq)
    keep_mask(led, step, mask)


def dense_block_flops(arch: Arch, step: Step, kind: BlockKind) -> BlockFlops:
    """`Family.block_flops` of attention and a two-matrix MLP in every block, the residual
    dropout (if any) outside the attention: it keeps the MLP's output (Falcon, GPT-NeoX, OPT)."""
    return attention_block_flops(
        arch,
        step,
        mlp=dense_mlp_flops(arch, step),
        attention_kept_after=False,
        mlp_kept_after=arch.hidden_dropout > 0,
    )


def layer_norm_rotary_attention(
    led: Ledger,
    arch: Arch,
    step: Step,
    mode: BlockMode,
    *,
    mask: str | None,
    attention: Callable[[Ledger, Arch, Step, str], None],
) -> str | None:
    """A block opening with a LayerNorm and a rotary attention on it (Falcon, GPT-NeoX):
    checkpointed whole, it keeps its input and nothing else runs (None); with the attention
    checkpointed, the normed input; else what ``attention`` keeps.  Returns the normed input."""
    if mode == "full":
        led.keep("in", step.dtype_bytes * hidden_elements(arch, step))
        rotary_block_inputs(led, arch, step, mask)
        return None
    x = norm(led, step, "in", "ln_attn", kind="layer", rows=step.tokens, width=arch.hidden)
    if mode == "selective":
        led.keep(x, step.dtype_bytes * hidden_elements(arch, step))
        rotary_block_inputs(led, arch, step, mask)
    else:
        attention(led, arch, step, x)
    return x
