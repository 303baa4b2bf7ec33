"""The building blocks of the closed-form activation model: a ledger of kept storages.

Autograd keeps tensors, and memory is spent per STORAGE: a view kept by two
ops costs once; a dtype cast, a transpose + ``contiguous()`` or a dropout makes
a new storage.  The closed form therefore writes down, per op of a forward
pass, which storage its backward keeps, under a name: the same name means the
same storage, so aliasing (fp32 ``.to(float32)`` returning its input, ``q``,
``k``, ``v`` being views of one fused projection) is counted exactly once.

A `Ledger` holds name -> bytes for one scope (a block); `Step` carries the run
shape and what is trainable; a `BlockMode` says how a block is checkpointed.
The op helpers below (norms, linears, activations, dropout, the causal-LM
loss) are shared by every family in `ckpt_core._memory.families`.

Pure arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

# How one block is checkpointed, named after the tier that does it to every block:
# off - it runs normally and keeps what its ops keep; selective - its attention
# module is checkpointed (it keeps only its tensor inputs); full - the whole block
# is checkpointed (it keeps only its tensor inputs).
BlockMode = Literal["off", "selective", "full"]

GLOBAL = "g:"  # names shared by every block (cos / sin, masks, ids): counted once per model


@dataclass(frozen=True, slots=True)
class Step:
    """One training forward: batch, sequence, dtype bytes and what requires grad.

    ``trainable_weights``: every weight is trained (full fine-tune).
    ``adapters``: the linears (and parameters) that carry a LoRA adapter of rank
    ``lora_rank`` (its input is kept for the adapter even when the base
    weight is frozen); a set, so equal steps compare and hash equal.
    ``hidden_bytes``: bytes per element of the residual stream between blocks
    when it differs from ``dtype_bytes`` (fp32 under autocast); 0 means
    ``dtype_bytes``.  ``padded``: the batch carries an
    attention mask with padding (`ckpt_core._memory.attention.mask_kind`).
    ``fp32_linears``: the linears loaded in fp32 among half-precision ones
    (`Family.keep_in_fp32` under fp16): their input is cast to fp32, and so is
    their output.  ``held_inputs``: the linears are bitsandbytes' int8 ones, which
    keep their input as an attribute of the backward function (``ctx.tensors``),
    in every mode: checkpoint's hooks never see it.  ``gqa``: how sdpa runs grouped
    kv heads.
    """

    batch: int
    seq: int
    dtype_bytes: int
    attention: str  # fused | flash | eager (what transformers runs)
    trainable_weights: bool = True
    lora_rank: int = 0
    adapters: frozenset[str] = frozenset()
    hidden_bytes: int = 0
    padded: bool = False  # an attention mask with padding: sdpa gets a mask per sample
    fp32_linears: frozenset[str] = frozenset()
    held_inputs: bool = False
    # sdpa's calls with grouped kv heads and no mask (`ckpt_core._memory.attention.gqa_kind`):
    # native (a fused kernel takes them) | math | repeated (K / V repeated to every head)
    gqa: str = "native"

    def adapted(self, name: str) -> bool:
        """Whether the linear (or parameter) named so carries a LoRA adapter."""
        return name in self.adapters

    @property
    def residual_bytes(self) -> int:
        return self.hidden_bytes or self.dtype_bytes

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


class Ledger:
    """Storages one scope keeps: name -> bytes (a storage is as large as its largest view).

    ``held``: the storages linears keep as attributes (`Step.held_inputs`), by the
    name of the linear that keeps each: kept by a checkpointed block too.
    """

    __slots__ = ("held", "sizes")

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}
        self.held: dict[str, tuple[str, int]] = {}

    def keep(self, name: str, nbytes: int) -> None:
        if nbytes > self.sizes.get(name, 0):
            self.sizes[name] = nbytes

    def local_bytes(self) -> int:
        return sum(size for name, size in self.sizes.items() if not name.startswith(GLOBAL))

    def globals(self) -> dict[str, int]:
        return {name: size for name, size in self.sizes.items() if name.startswith(GLOBAL)}


def norm(
    led: Ledger,
    step: Step,
    x: str,
    tag: str,
    *,
    kind: str,
    rows: int,
    width: int,
    in_bytes: int = 0,
    weight: int = 0,
) -> str:
    """A normalization of ``rows`` vectors of ``width`` in storage ``x``; returns the output.

    ``in_bytes``: bytes per element of ``x`` when it differs from the dtype's;
    ``weight``: elements of the norm's weight when not ``width`` (Cohere's q / k
    norms have one per head).
    What each implementation's backward keeps (bf16 / fp16 runs; from an fp32
    input the upcast is the input itself):

    - ``rms`` (Llama): fp32 input, rstd, the normalized value cast back to the
      dtype (for the weight's gradient);
    - ``rms_gemma``: fp32 input, rstd, fp32 normalized value and ``1 + w``;
    - ``rms_olmo``: fp32 input, rstd, fp32 normalized value;
    - ``t5``: fp32 input for the variance, the input itself, rstd, the
      normalized value in the dtype;
    - ``layer`` (``nn.LayerNorm``): the input, mean and rstd;
    - ``cohere`` (CohereLayerNorm, written out in fp32): ``x - mean`` twice (the
      variance's ``pow`` keeps one, the product with rstd the other), rstd, the
      weight's fp32 copy (for the input's gradient) and the normalized value (for
      the weight's).
    """
    elem_bytes, n = step.dtype_bytes, rows * width
    in_bytes = in_bytes or elem_bytes
    upcast = x if in_bytes == 4 else f"{tag}.x32"
    trained = step.trainable_weights
    if kind == "layer":
        led.keep(x, in_bytes * n)
        led.keep(f"{tag}.mean", 4 * rows)
        led.keep(f"{tag}.rstd", 4 * rows)
        return f"{tag}.out"
    if kind == "cohere":
        led.keep(f"{tag}.centered", 4 * n)
        led.keep(f"{tag}.centered_again", 4 * n)
        led.keep(f"{tag}.rstd", 4 * rows)
        led.keep(f"{tag}.weight32", 4 * (weight or width))
        if trained:
            led.keep(f"{tag}.normed32", 4 * n)
        return f"{tag}.out"
    led.keep(upcast, 4 * n)
    led.keep(f"{tag}.rstd", 4 * rows)
    if kind == "rms":
        if trained:
            led.keep(f"{tag}.normed", elem_bytes * n)
    elif kind in ("rms_gemma", "rms_olmo"):
        if trained:
            led.keep(f"{tag}.normed32", 4 * n)
        if kind == "rms_gemma":
            led.keep(f"{tag}.one_plus_w", 4 * width)
    elif kind == "t5":
        led.keep(x, in_bytes * n)
        if trained:
            led.keep(f"{tag}.normed", elem_bytes * n)
    return f"{tag}.out"


OUTPUT_EMBEDDINGS: Final = frozenset({"lm_head", "cls.predictions.decoder"})


def linear(
    led: Ledger, step: Step, x: str, fan_in: int, name: str, *, rows: int = 0, in_bytes: int = 0
) -> None:
    """A linear layer keeps its input for its weight's gradient; a LoRA adapter keeps its own.

    ``in_bytes``: bytes per element of ``x`` when it differs from the dtype's."""
    rows = rows or step.tokens
    in_bytes = in_bytes or step.dtype_bytes
    adapted = step.adapted(name)
    # bitsandbytes leaves the output embeddings unquantized (get_keys_to_not_convert).
    held = step.held_inputs and name not in OUTPUT_EMBEDDINGS
    if held:
        led.held[name] = (x, in_bytes * rows * fan_in)
    if step.trainable_weights or held:
        led.keep(x, in_bytes * rows * fan_in)
    if adapted:  # PEFT casts the input to the fp32 adapter (a copy unless already fp32)
        led.keep(x if in_bytes == 4 else f"{name}.lora_in", 4 * rows * fan_in)
        led.keep(f"{name}.lora_mid", 4 * rows * step.lora_rank)


def activation(led: Ledger, step: Step, x: str, *, tag: str, kind: str, elements: int) -> str:
    """An activation function on storage ``x``; returns its output's name.

    silu / gelu keep the input; relu keeps its output; transformers'
    ``gelu_new`` is written out in Python and keeps the input, the tanh, half
    the input and ``1 + tanh``.
    """
    elem_bytes = step.dtype_bytes
    out = f"{tag}.out"
    if kind == "relu":
        led.keep(out, elem_bytes * elements)
        return out
    led.keep(x, elem_bytes * elements)
    if kind == "gelu_new":
        for part in ("tanh", "half", "one_plus"):
            led.keep(f"{tag}.{part}", elem_bytes * elements)
    return out


def dropout(led: Ledger, step: Step, x: str, *, tag: str, p: float, elements: int) -> str:
    """Training dropout keeps a 1-byte mask (CUDA's fused kernel); p = 0 is the identity."""
    if p <= 0:
        return x
    led.keep(f"{tag}.mask", elements)
    return f"{tag}.out"


def causal_loss(led: Ledger, tokens: int, vocab: int) -> None:
    """transformers' ForCausalLMLoss: logits upcast to fp32, shifted labels, log-softmax kept."""
    led.keep("loss.log_softmax", 4 * tokens * vocab)
    led.keep("loss.labels", 8 * tokens)
    led.keep("loss.weight", 4)
