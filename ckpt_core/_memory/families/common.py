"""Op sequences that several families share (GPT-2, Falcon, BERT): MLP, head, masks.

Pure arithmetic.
"""

from __future__ import annotations

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.attention import mask_bytes
from ckpt_core._memory.ledger import GLOBAL, Ledger, Step, activation, causal_loss, linear, norm


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
    """Final LayerNorm, LM head, fp32 causal-LM loss (GPT-2, Falcon)."""
    led = Ledger()
    out = norm(led, step, "in", "ln_f", kind="layer", rows=step.tokens, width=arch.hidden)
    linear(led, step, out, arch.hidden, "lm_head")
    causal_loss(led, step.tokens, arch.vocab)
    return led


def keep_mask(led: Ledger, step: Step, mask: str | None) -> None:
    """The mask a checkpointed region keeps as an input, if the model has one."""
    if mask is not None:
        led.keep(f"{GLOBAL}mask.{mask}", mask_bytes(step, mask))
