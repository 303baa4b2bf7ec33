"""T5's forward for the step replay: two stacks, relative position bias, cross-attention.

transformers' ``T5ForConditionalGeneration``: the encoder stack
(``T5Stack``: the shared token lookup, its mask, dropout, the blocks, the final
``T5LayerNorm`` and dropout), then the decoder stack on the labels shifted
right, whose blocks add cross-attention over the encoder's output, then the
LM head on the decoder's output scaled by ``d_model ** -0.5`` and the loss in
the logits' dtype.  The first block of each stack computes the relative
position bias (the buckets' sequence x sequence int64 temporaries, then the
bias table's lookup) and the stack hands it to every later block; the
decoder's first block also makes the cross-attention's zero bias
(`ckpt_core._memory.t5_attention_trace`, with sdpa's float masks).  Loaded in
fp16, ``wo`` stays in fp32 (``_keep_in_fp32_modules``): its input is cast to
fp32 and the residual stream is fp32 from the first feed-forward on; an fp16
residual is clamped after each sub-layer.  Sizes in bytes.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Final

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.fused_trace import dropout, dropped_out
from ckpt_core._memory.linear_trace import TraceRecipe, kept_in_fp32, left_unquantized, linear
from ckpt_core._memory.model_trace import Inputs, TraceModel, bidirectional_mask, embedding
from ckpt_core._memory.pointwise_trace import gelu_new
from ckpt_core._memory.t5_attention_trace import CROSS, SELF, attention, shared_names

__all__ = ["T5", "norm_count"]

_WO: Final = "DenseReluDense.wo"


def parameters(arch: Arch, index: int) -> list[tuple[str, int, int, int]]:
    """Block ``index``'s matrices in module order (encoder blocks first): self-attention,
    cross-attention in a decoder block, then the feed-forward's."""
    h, inner, ff = arch.hidden, arch.heads * arch.head_dim, arch.intermediate
    modules = (SELF, CROSS) if index >= arch.encoder_layers else (SELF,)
    out: list[tuple[str, int, int, int]] = []
    for module in modules:
        out += [(f"{module}.{x}", 0, h, inner) for x in ("q", "k", "v")]
        out.append((f"{module}.o", 0, inner, h))
    ups = ("wi_0", "wi_1") if arch.glu else ("wi",)
    out += [(f"DenseReluDense.{x}", 0, h, ff) for x in ups]
    out.append((_WO, 0, ff, h))
    return out


def _wide(recipe: TraceRecipe) -> bool:
    """``wo`` runs in fp32 among half-precision weights."""
    return kept_in_fp32(recipe, _WO) and recipe.act < 4


def _residual(recipe: TraceRecipe, *, first: bool) -> int:
    """A block input's bytes per element: fp32 after a wide ``wo``, except the first
    block's of each stack (the embeddings' dropout)."""
    return 4 if _wide(recipe) and not first else recipe.act


def _norm(sim: Sim, x: int, arch: Arch, recipe: TraceRecipe, *, dtype: int) -> int:
    """T5LayerNorm.forward on ``x`` of ``dtype`` bytes per element: ``x.to(float32)`` (a
    temporary that only pow keeps), ``pow(2).mean(-1)``, then ``x * rsqrt(variance +
    eps)``, which keeps x itself (not the fp32 copy, as Llama's RMSNorm does); the
    product is cast to the weight's dtype, then times the weight.  The variance is a
    local to the return."""
    rows, width = recipe.batch * recipe.seq, arch.hidden
    full = 4 * rows * width
    upcast = sim.op([x], full) if dtype != 4 else x
    square = sim.op([upcast], full, save=[upcast], backward_temps=[full, full])
    if upcast != x:  # unnamed: pow's call releases it
        sim.drop(upcast)
    variance = sim.op([square], 4 * rows)
    sim.drop(square)
    rstd = sim.op([variance], 4 * rows)  # `rsqrt(variance + eps)`: the sum dies at once
    # MulBackward0 makes both gradients in fp32; the engine sums rstd's to its shape and
    # casts x's to its dtype.
    normed = sim.op([x, rstd], full, save=[x, rstd], cast=True)
    sim.drop(rstd)
    weight = recipe.kept if recipe.quantized else recipe.weights
    cast = sim.op([normed], weight * rows * width) if weight < 4 else normed
    if cast != normed:
        sim.drop(normed)
    out = sim.op(
        [cast],
        weight * rows * width,
        save=[cast] if recipe.full else [],
        saves_other=True,
        backward_scratch=[weight * rows * width] if recipe.full else [],
    )
    sim.drop(variance, cast)
    return out


def _prepare(sim: Sim, arch: Arch, recipe: TraceRecipe, workspace: int) -> Inputs:
    """The encoder's T5Stack.forward up to its first block: the lookup (the adapters'
    leaf, else a local of the stack), the padding mask of a padded batch, the dropout."""
    embeds = embedding(sim, arch, recipe)
    inputs = Inputs(embeds, None)
    _share(inputs, "encoder.mask", bidirectional_mask(sim, recipe))
    hidden = _embed_dropout(sim, embeds, arch=arch, recipe=recipe, inputs=inputs, stack="encoder")
    sim.forward_workspace = workspace  # the first matmul is block 0's q
    # The adapters' leaf: the lookup the dropout rebound, else the step holds `hidden`.
    leaf = inputs.leaves.pop() if inputs.leaves else None
    return dataclasses.replace(inputs, hidden=hidden, leaf=leaf)


def _embed_dropout(
    sim: Sim, embeds: int, *, arch: Arch, recipe: TraceRecipe, inputs: Inputs, stack: str
) -> int:
    """A stack's ``self.dropout(inputs_embeds)``.  With adapters the lookup is a leaf
    (PEFT's input-grad hook), held to the step's end (`Inputs.leaves`); trained, it is a
    local of the stack's forward.  Without dropout the lookup is the first block's input."""
    elements = recipe.batch * recipe.seq * arch.hidden
    hidden = dropout(sim, embeds, sim.size(embeds), elements, arch.embed_dropout)
    if not recipe.full:
        inputs.leaves.append(embeds if hidden != embeds else sim.hold(embeds))
    elif hidden != embeds:
        inputs.shared[f"{stack}.embeds"] = embeds
    return hidden


def _share(inputs: Inputs, name: str, tensor: int | None) -> None:
    if tensor is not None:
        inputs.shared[name] = tensor


def _final(sim: Sim, x: int, recipe: TraceRecipe, arch: Arch) -> int:
    """A stack's final T5LayerNorm and dropout (the rebinding frees the norm's output)."""
    normed = _norm(sim, x, arch, recipe, dtype=_residual(recipe, first=False))
    return dropped_out(sim, normed, recipe, arch.hidden, arch.hidden_dropout)


def _stack_end(
    sim: Sim, x: int, *, arch: Arch, recipe: TraceRecipe, inputs: Inputs, stack: int
) -> int:
    """After a stack's last block: its final norm and dropout (the loop's rebinding frees
    the last block's output); what the stack's blocks shared dies as it returns (a
    checkpointed block holds what it read to its backward).  The decoder's output is held
    by the model's forward to the loss, the encoder's returned with the logits.  After
    the encoder, the decoder's T5Stack.forward up to its first block."""
    out = _final(sim, x, recipe, arch)
    sim.drop(x)
    prefix = "decoder." if stack else "encoder."
    # Their ids stay in `shared`: the recomputes of the blocks that hold them read them.
    sim.drop(*(tensor for name, tensor in inputs.shared.items() if name.startswith(prefix)))
    if stack:  # `decoder_outputs`, the model's local
        inputs.until_loss.append(sim.hold(out))
        return out
    inputs.returned_outputs.append(out)  # Seq2SeqLMOutput's encoder_last_hidden_state
    inputs.shared["encoder_out"] = out
    tokens = recipe.batch * recipe.seq
    inputs.until_loss.append(sim.new(8 * tokens))  # the labels shifted right
    embeds = embedding(sim, arch, recipe)  # the hook fires on the shared lookup again
    if recipe.attention == "eager":  # create_causal_mask's float mask
        _share(inputs, "decoder.mask", sim.new(recipe.act * recipe.batch * recipe.seq**2))
    _share(inputs, "decoder.cross_mask", bidirectional_mask(sim, recipe))
    return _embed_dropout(sim, embeds, arch=arch, recipe=recipe, inputs=inputs, stack="decoder")


def _block(
    sim: Sim,
    x: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    inputs: Inputs,
    index: int,
    selective: bool = False,
) -> int:
    """T5Block.forward: self-attention, cross-attention in a decoder block, the
    feed-forward, each a residual sub-layer (an fp16 residual clamped after each).
    ``selective``: the attention sub-layers are checkpointed."""
    decoder = index >= arch.encoder_layers
    stack = "decoder" if decoder else "encoder"
    first = index in (0, arch.encoder_layers)
    weights: list[int] = []  # eager's attention weights: the block's `_` holds them
    residual = _residual(recipe, first=first)  # what the attention sub-layers return too
    sublayer = functools.partial(
        _attention_layer, arch=arch, recipe=recipe, inputs=inputs, stack=stack, first=first
    )

    def attend(s: Sim, y: int, *, cross: bool) -> int:
        return sublayer(
            s, y, cross=cross, residual=residual, held=None if s.recomputing else weights
        )

    def run(y: int, *, cross: bool) -> int:
        region = functools.partial(attend, cross=cross)
        return sim.checkpoint(region, y) if selective else region(sim, y)

    hidden = _clamped(sim, run(x, cross=False), arch, recipe)
    if decoder:
        crossed = run(hidden, cross=True)
        sim.drop(hidden)
        hidden = _clamped(sim, crossed, arch, recipe)
    out = _feed_forward_layer(sim, hidden, arch=arch, recipe=recipe, residual=residual)
    sim.drop(hidden, *weights)
    return _clamped(sim, out, arch, recipe)


def _clamped(sim: Sim, x: int, arch: Arch, recipe: TraceRecipe) -> int:
    """T5Block's clamp of an fp16 residual ``x`` (an fp32 one, after a wide ``wo``, is
    not): ``isinf(x).any()`` (a bool temporary), the bound, then ``torch.clamp``, which
    keeps its input; the rebinding frees it otherwise."""
    if not recipe.fp16 or sim.size(x) != 2 * recipe.batch * recipe.seq * arch.hidden:
        return x
    sim.drop(sim.new(sim.size(x) // 2))
    out = sim.op([x], sim.size(x), save=[x])
    sim.drop(x)
    return out


def _attention_layer(
    sim: Sim,
    x: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    inputs: Inputs,
    stack: str,
    first: bool,
    cross: bool,
    residual: int,
    held: list[int] | None,
) -> int:
    """T5LayerSelfAttention / T5LayerCrossAttention.forward: the norm, the attention,
    dropout, then ``hidden_states + dropout(...)``; the norm's and attention's outputs
    are locals to the return."""
    tokens, h = recipe.batch * recipe.seq, arch.hidden
    # What the sub-layer reads besides x: its mask, the bias a first block handed on, the
    # encoder's output; a checkpoint holds them to its backward.
    mask, bias = shared_names(stack, cross=cross)
    names = [mask, *([] if first else [bias]), *(["encoder_out"] if cross else [])]
    sim.hold_arguments(*(inputs.shared[name] for name in names if name in inputs.shared))
    normed = _norm(sim, x, arch, recipe, dtype=residual)
    attn = attention(
        sim,
        normed,
        arch=arch,
        recipe=recipe,
        inputs=inputs,
        stack=stack,
        first=first,
        cross=cross,
        held=held,
    )
    dropped = dropout(sim, attn, sim.size(attn), tokens * h, arch.hidden_dropout)
    out = sim.op([x, dropped], residual * tokens * h, alias=True)
    sim.drop(*{normed, attn, dropped})
    return out


def _feed_forward_layer(sim: Sim, x: int, *, arch: Arch, recipe: TraceRecipe, residual: int) -> int:
    """T5LayerFF.forward: the norm, DenseReluDense (or the gated one), dropout, then
    ``hidden_states + dropout(...)``.  DenseReluDense's rebinding of the norm's output and
    its own locals die as it returns; the MLP's output with its dropout at the end."""
    tokens, h, ff = recipe.batch * recipe.seq, arch.hidden, arch.intermediate
    normed = _norm(sim, x, arch, recipe, dtype=residual)
    size = recipe.act * tokens * ff
    if arch.glu:  # `act(wi_0(x)) * wi_1(x)`
        gate = linear(sim, normed, "DenseReluDense.wi_0", (h, ff), recipe)
        activated = _activation(sim, gate, arch, size)
        up = linear(sim, normed, "DenseReluDense.wi_1", (h, ff), recipe)
        hidden = sim.op([activated, up], size, save=[activated, up])
        sim.drop(activated, up)
    else:
        hidden = _activation(
            sim, linear(sim, normed, "DenseReluDense.wi", (h, ff), recipe), arch, size
        )
    hidden = dropped_out(sim, hidden, recipe, ff, arch.hidden_dropout)
    wo = recipe
    if _wide(recipe):  # `hidden_states.to(self.wo.weight.dtype)`, then the fp32 matmul
        cast = sim.op([hidden], 4 * tokens * ff)
        sim.drop(hidden)
        hidden = cast
        wo = dataclasses.replace(recipe, act=4, weights=4, quantized=False, int8=False)
    elif left_unquantized(recipe, _WO):  # a plain linear of the prepared weights' dtype
        wo = dataclasses.replace(recipe, weights=recipe.kept, quantized=False, int8=False)
    out = linear(sim, hidden, _WO, (ff, h), wo)
    sim.drop(normed, hidden)
    dropped = dropout(sim, out, sim.size(out), tokens * h, arch.hidden_dropout)
    width = max(residual, 4 if _wide(recipe) else recipe.act)
    total = sim.op([x, dropped], width * tokens * h, alias=True)
    sim.drop(*{out, dropped})
    return total


def _activation(sim: Sim, x: int, arch: Arch, size: int) -> int:
    """The MLP's activation; the rebinding frees its input unless it keeps it: ReLU keeps
    its output, ``gelu_new`` (written out) and GELU their input."""
    if arch.act == "gelu_new":
        out = gelu_new(sim, x, size)
    elif arch.act == "relu":
        out = sim.op([x], size, save_out=True)
    else:
        out = sim.op([x], size, save=[x])
    sim.drop(x)
    return out


def _scaled_output(sim: Sim, x: int, rows: int, width: int, recipe: TraceRecipe) -> int:
    """T5ForConditionalGeneration: ``sequence_output * (model_dim ** -0.5)`` before the
    head (the decoder's output, the factor, is held to the loss: `_stack_end`)."""
    return sim.op([x], sim.size(x))


def norm_count(arch: Arch) -> int:
    """T5's RMS norms: two per encoder block, three per decoder block, a final one per
    stack."""
    return 2 * arch.encoder_layers + 3 * arch.layers + 2


T5 = TraceModel(
    prepare=_prepare,
    block=_block,
    norm=_scaled_output,
    parameters=parameters,
    stack_end=_stack_end,
    norms=norm_count,
)
