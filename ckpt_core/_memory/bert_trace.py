"""BERT's forward for the step replay: post-LayerNorm blocks, learned positions and types.

transformers' ``BertForMaskedLM``: ``BertEmbeddings`` (the token, token-type and
position lookups, their sums, a LayerNorm, dropout), ``BertLayer`` (the
attention's ``query`` / ``key`` / ``value``, its kernel, ``attention.output``'s
dense, dropout and ``LayerNorm(x + input)``; then ``intermediate.dense``, the
activation, ``output.dense``, dropout and the second LayerNorm) and
``BertOnlyMLMHead`` (a dense, the activation and a LayerNorm before the tied
decoder).  Without padding neither sdpa nor eager gets a mask
(``create_bidirectional_mask`` skips it); a padded batch's is per sample.  A
selective block checkpoints ``BertAttention``, its output LayerNorm included.
Sizes in bytes.
"""

from __future__ import annotations

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.attention_trace import fused_attention
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.fused_trace import dropped_out, layer_norm
from ckpt_core._memory.gpt2_trace import eager_attention_in_dtype, head_view
from ckpt_core._memory.linear_trace import TraceRecipe, linear
from ckpt_core._memory.model_trace import Inputs, TraceModel, bidirectional_mask, embedding

__all__ = ["BERT"]

_ATTENTION = tuple(f"attention.self.{name}" for name in ("query", "key", "value"))
_ATTENTION_OUT = "attention.output.dense"
_MLP = ("intermediate.dense", "output.dense")
_TRANSFORM = "cls.predictions.transform.dense"  # the MLM head's dense before the decoder


def parameters(arch: Arch, index: int) -> list[tuple[str, int, int, int]]:
    """Layer ``index``'s matrices in module order: (name, 0, fan in, fan out)."""
    del index  # every block is alike
    h, inter = arch.hidden, arch.intermediate
    names = (*_ATTENTION, _ATTENTION_OUT, *_MLP)
    shapes = ((h, h),) * 4 + ((h, inter), (inter, h))
    return [(name, 0, *shape) for name, shape in zip(names, shapes, strict=True)]


def _prepare(sim: Sim, arch: Arch, recipe: TraceRecipe, workspace: int) -> Inputs:
    """BertEmbeddings.forward: the token lookup; the token types gathered from the
    buffer (``torch.gather``, then expanded to the batch) and looked up; their sum; the
    positions' lookup (a slice of the buffer's ids) and the second sum, which frees the
    first; the LayerNorm and dropout, each rebinding freeing what it replaces.  The
    lookups and the gathered ids are locals to its return, except the token lookup of
    adapters' training: their leaf.  A trained lookup keeps its ids for the backward.
    Then BertModel's mask (`bidirectional_mask`), which every layer reads; its forward
    holds the embeddings' output until it returns."""
    tokens, seq, h = recipe.batch * recipe.seq, recipe.seq, arch.hidden
    size = recipe.residual * tokens * h
    embeds = embedding(sim, arch, recipe)
    types_ids = sim.new(8 * seq)
    full, weights = recipe.full, recipe.weights
    types = sim.op([], size, param_grad=weights * arch.type_vocab * h) if full else sim.new(size)
    summed = sim.op([embeds, types], size, alias=True)
    looked_up = recipe.residual * seq * h
    positions = (
        sim.op([], looked_up, param_grad=weights * arch.positions * h)
        if full
        else sim.new(looked_up)
    )
    total = sim.op([summed, positions], size, alias=True)
    sim.drop(summed)
    normed = layer_norm(sim, total, tokens, h, recipe)
    sim.drop(total)
    hidden = dropped_out(sim, normed, recipe, h, arch.embed_dropout, dtype=recipe.residual)
    sim.drop(types, positions)
    if full:
        sim.drop(embeds)
    else:
        sim.drop(types_ids)
    mask = bidirectional_mask(sim, recipe)
    sim.forward_workspace = workspace  # the first matmul is layer 0's query
    return Inputs(
        hidden,
        mask,
        step_held=(types_ids,) if full else (),
        forward_held=() if mask is None else (mask,),
        leaf=None if full else embeds,
        unread=(sim.hold(hidden),),  # BertModel.forward's `embedding_output`
    )


def _attention(
    sim: Sim,
    x: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    mask: int | None,
    held: list[int] | None = None,
) -> int:
    """BertAttention.forward: BertSelfAttention (q, k and v views of their projections,
    locals to its return; the kernel), then BertSelfOutput on its output (dense, dropout,
    ``LayerNorm(hidden_states + input_tensor)``), which the caller's name holds until that
    returns.  Eager's weights go to ``held`` when given (the layer's ``_``), else die at
    once."""
    tokens, h = recipe.batch * recipe.seq, arch.hidden
    q_name, k_name, v_name = _ATTENTION
    query = head_view(sim, linear(sim, x, q_name, (h, h), recipe, bias=True), recipe)
    eager = recipe.attention == "eager"
    key = linear(sim, x, k_name, (h, h), recipe, bias=True, strided_grad=eager)
    value = head_view(sim, linear(sim, x, v_name, (h, h), recipe, bias=True), recipe)
    if eager:
        attn, weights = eager_attention_in_dtype(
            sim, query, key, value, arch=arch, recipe=recipe, mask=mask
        )
        if held is None:
            sim.drop(weights)
        else:
            held.append(weights)
    else:
        attn = fused_attention(sim, query, key, value, arch=arch, recipe=recipe, mask=mask)
    sim.drop(query, key, value)
    return _output(sim, attn, x, _ATTENTION_OUT, (h, h), tokens=tokens, arch=arch, recipe=recipe)


def _output(
    sim: Sim,
    x: int,
    residual: int,
    name: str,
    shape: tuple[int, int],
    *,
    tokens: int,
    arch: Arch,
    recipe: TraceRecipe,
) -> int:
    """BertSelfOutput / BertOutput.forward: ``dense``, dropout, then the LayerNorm of the
    sum with ``residual``, whose rebinding frees the dropout's output; ``x`` (the
    caller's) dies as it returns."""
    h = arch.hidden
    dense = linear(sim, x, name, shape, recipe, bias=True)
    dropped = dropped_out(sim, dense, recipe, h, arch.hidden_dropout)
    summed = sim.op([dropped, residual], recipe.residual * tokens * h, alias=True)
    out = layer_norm(sim, summed, tokens, h, recipe)
    sim.drop(summed, dropped, x)  # `hidden_states = self.LayerNorm(...)` rebinds it
    return out


def _layer(
    sim: Sim,
    x: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    inputs: Inputs,
    index: int,
    selective: bool = False,
) -> int:
    """BertLayer.forward: the attention (checkpointed alone when ``selective``), then
    ``feed_forward_chunk``: ``intermediate`` (dense, activation: its output a local until
    the chunk returns) and ``output``."""
    del index  # every layer reads the one mask
    tokens, h, inter = recipe.batch * recipe.seq, arch.hidden, arch.intermediate
    weights: list[int] = []  # `self_attention_output, _ = self.attention(...)`
    if selective:
        attn = sim.checkpoint(
            lambda s, y, held=None: _attention(
                s, y, arch=arch, recipe=recipe, mask=inputs.mask, held=held
            ),
            x,
            weights,
        )
    else:
        attn = _attention(sim, x, arch=arch, recipe=recipe, mask=inputs.mask, held=weights)
    up = linear(sim, attn, _MLP[0], (h, inter), recipe, bias=True)
    activated = sim.op([up], recipe.act * tokens * inter, save=[up])
    sim.drop(up)
    out = _output(
        sim, activated, attn, _MLP[1], (inter, h), tokens=tokens, arch=arch, recipe=recipe
    )
    sim.drop(attn, *weights)
    return out


def _transform(sim: Sim, x: int, rows: int, width: int, recipe: TraceRecipe) -> int:
    """BertPredictionHeadTransform.forward: dense, activation, LayerNorm (each rebinding
    frees what it replaces); its output is the decoder's input."""
    dense = linear(sim, x, _TRANSFORM, (width, width), recipe, bias=True)
    activated = sim.op([dense], recipe.act * rows * width, save=[dense])
    sim.drop(dense)
    out = layer_norm(sim, activated, rows, width, recipe, dtype=recipe.act)
    sim.drop(activated)
    return out


BERT = TraceModel(
    prepare=_prepare,
    block=_layer,
    norm=_transform,
    parameters=parameters,
    tables=lambda arch: (arch.positions, arch.type_vocab),
    head=lambda arch: ((_TRANSFORM, 0, arch.hidden, arch.hidden),),
    norm_in_head=True,
)
