"""GPT-2's forward for the step replay: learned positions, LayerNorms, one fused c_attn, dropout.

transformers' ``GPT2Model`` / ``GPT2Block`` / ``GPT2Attention`` / ``GPT2MLP``
on CUDA.  LayerNorm and dropout are single kernels (`ckpt_core._memory.fused_trace`);
masks, the fused attention kernel, the linears with their adapters and the MLP
are the shared ones.  Sizes in bytes.
"""

from __future__ import annotations

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.attention_trace import fused_attention
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.block_trace import mlp
from ckpt_core._memory.fused_trace import dropout, dropped_out, layer_norm
from ckpt_core._memory.linear_trace import TraceRecipe, linear, strided_output
from ckpt_core._memory.model_trace import (
    Inputs,
    TraceModel,
    embedding,
    layer_masks,
    lookup_inputs,
)

__all__ = ["GPT2", "eager_attention_in_dtype", "head_view", "parameters"]

# The attention's linears, in module order (GPT2Attention makes c_attn first).
_ATTENTION = ("attn.c_attn", "attn.c_proj")


def parameters(arch: Arch, index: int) -> list[tuple[str, int, int, int]]:
    """Layer ``index``'s matrices in module order: (name, 0, fan in, fan out)."""
    del index  # every block is alike
    h, inter = arch.hidden, arch.intermediate
    names = (*_ATTENTION, *(f"mlp.{name}" for name in arch.mlp_names))
    shapes = ((h, 3 * h), (h, h), (h, inter), (inter, h))
    return [(name, 0, *shape) for name, shape in zip(names, shapes, strict=True)]


def _prepare(sim: Sim, arch: Arch, recipe: TraceRecipe, workspace: int) -> Inputs:
    """GPT2Model.forward up to the first block: ``wte(input_ids)``, the position ids
    (``arange`` + the cache's length), ``wpe(position_ids)``, their sum, the causal mask,
    then the embeddings' dropout, whose rebinding frees the sum.  The two lookups are
    locals until the forward returns (adapters: the token embeddings are their leaf);
    the position ids reach every block."""
    tokens, seq, h = recipe.batch * recipe.seq, recipe.seq, arch.hidden
    size = recipe.residual * tokens * h
    embeds = embedding(sim, arch, recipe)
    arange = sim.new(8 * seq)
    ids = sim.new(8 * seq)
    sim.drop(arange)
    table = recipe.weights * arch.positions * h
    looked_up = recipe.residual * seq * h
    positions = sim.op([], looked_up, param_grad=table) if recipe.full else sim.new(looked_up)
    summed = sim.op([embeds, positions], size, alias=True)
    masks = layer_masks(sim, arch, recipe)
    hidden = dropped_out(sim, summed, recipe, h, arch.embed_dropout, dtype=recipe.residual)
    # The first matmul is block 0's c_attn.
    sim.forward_workspace = workspace
    return lookup_inputs(hidden, embeds, recipe, masks=masks, ids=ids, forward_locals=(positions,))


def _attention(
    sim: Sim,
    x: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    mask: int | None,
    held: list[int] | None = None,
) -> int:
    """GPT2Attention.forward on the normed ``x``: ``c_attn(x).split(...)`` (views of its
    output, which nothing else names), the kernel, ``c_proj``, the residual dropout;
    q, k and v are locals until it returns.  Eager's weights go to ``held`` when given
    (the block's ``_``), else die on return."""
    tokens, act, h = recipe.batch * recipe.seq, recipe.act, arch.hidden
    qkv = linear(sim, x, _ATTENTION[0], (h, 3 * h), recipe, bias=True)
    query, key, value = sim.views(qkv, [act * tokens * h] * 3)
    sim.drop(qkv)
    if recipe.attention == "eager" and mask is not None:
        query, value = head_view(sim, query, recipe), head_view(sim, value, recipe)
        attn, weights = eager_attention_in_dtype(
            sim, query, key, value, arch=arch, recipe=recipe, mask=mask
        )
        held_weights = [weights]
    else:
        attn, held_weights = (
            fused_attention(sim, query, key, value, arch=arch, recipe=recipe, mask=mask),
            [],
        )
    projected = linear(sim, attn, _ATTENTION[1], (h, h), recipe, bias=True)
    sim.drop(attn)
    out = dropped_out(sim, projected, recipe, h, arch.hidden_dropout)
    sim.drop(query, key, value)
    if held is None:
        sim.drop(*held_weights)
    else:
        held.extend(held_weights)
    return out


def head_view(sim: Sim, x: int, recipe: TraceRecipe) -> int:
    """``x.view(batch, seq, heads, dim).transpose(1, 2)`` of q or v, which rebinds its
    name.  With eager attention the gradient reaching the view is bmm's, transposed back:
    not viewable, so ViewBackward0's reshape copies it (the engine gets there after the
    attention's whole backward).  k's, the gradient of ``k.transpose(2, 3)``, views back
    (`linear`'s ``strided_grad``); fused kernels' gradients view back too."""
    return strided_output(sim, x) if recipe.attention == "eager" else x


def eager_attention_in_dtype(
    sim: Sim,
    query: int,
    key: int,
    value: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    mask: int | None,
    bias: int | None = None,
) -> tuple[int, int]:
    """GPT-2's eager_attention_forward (and BERT's, T5's): ``matmul(q, k^T) * scaling``,
    ``+ bias`` (T5's position bias), ``+ mask`` when there is one, softmax in the
    activations' dtype (or
    `_upcast_and_reordered`), the attention dropout, ``matmul(weights, v)``, then the
    attention's ``reshape``; returns (its output, the dropped-out weights).

    q, k and v are views of the projections' (batch, seq, hidden) outputs (`head_view`):
    with batch > 1, matmul's reshape to 3-D cannot merge (batch, heads) and copies each
    operand it reads."""
    tokens, act, batch, seq = recipe.batch * recipe.seq, recipe.act, recipe.batch, recipe.seq
    width = act * tokens * arch.hidden
    scores = batch * arch.heads * seq * seq
    copies = batch > 1
    query_c = sim.op([query], width, alias=True) if copies else query
    key_c = sim.op([key], width, alias=True) if copies else key
    # SoftMax.cu softmax_backward_cuda_out: `tmp = grad * output`, in the gradient's dtype.
    extra = recipe.eager_extra
    if arch.upcast_attention:
        probs = _upcast_and_reordered(sim, query_c, key_c, arch=arch, recipe=recipe, mask=mask)
    else:
        raw = sim.op([query_c, key_c], act * scores, save=[query_c, key_c], matmul=True)
        if copies:
            sim.drop(query_c, key_c)
        masked = sim.op([raw], act * scores)
        sim.drop(raw)
        for added in (bias, mask):
            if added is not None:
                scaled, masked = masked, sim.op([masked, added], act * scores, alias=True)
                sim.drop(scaled)
        scratch = [act * scores] if extra else []
        probs = sim.op([masked], act * scores, save_out=True, backward_scratch=scratch)
        sim.drop(masked)
    weights = dropout(sim, probs, act * scores, scores, arch.attn_dropout)
    if weights != probs:
        sim.drop(probs)
    value_c = sim.op([value], width, alias=True) if copies else value
    out = sim.op([weights, value_c], width, save=[weights, value_c], matmul=True)
    if copies:
        sim.drop(value_c)
    # transpose(1, 2), then reshape: a copy.  Its gradient, transposed back, is copied
    # for the bmm's backward unless (batch, heads) merge (batch 1).
    flat = sim.op([out], width, alias=not copies)
    sim.drop(out)
    if copies and arch.upcast_attention:  # the reordered path's q / k locals
        sim.drop(query_c, key_c)
    return flat, weights


def _upcast_and_reordered(
    sim: Sim, query: int, key: int, *, arch: Arch, recipe: TraceRecipe, mask: int | None
) -> int:
    """GPT2Attention._upcast_and_reordered_attn (``reorder_and_upcast_attn``, eager only):
    fp32 scores made by ``torch.empty``, ``baddbmm`` of q and k upcast (both fp32 copies
    kept) into new ones, which the rebinding frees, ``+ mask``, the softmax in fp32 and
    its cast to the dtype; returns the cast weights.  ``query`` / ``key``: q and k
    reshaped to 3-D, locals of the caller's."""
    tokens, act = recipe.batch * recipe.seq, recipe.act
    scores = recipe.batch * arch.heads * recipe.seq * recipe.seq
    empty = sim.new(4 * scores)
    upcast = [sim.op([x], 4 * tokens * arch.hidden) if act != 4 else x for x in (query, key)]
    raw = sim.op(upcast, 4 * scores, save=upcast, matmul=True)
    if act != 4:
        sim.drop(*upcast)
    sim.drop(empty)
    masked = raw
    if mask is not None:
        masked = sim.op([raw, mask], 4 * scores, alias=True)
        sim.drop(raw)
    scratch = [4 * scores] if recipe.eager_extra else []
    softmax = sim.op([masked], 4 * scores, save_out=True, backward_scratch=scratch)
    sim.drop(masked)
    if act == 4:
        return softmax
    probs = sim.op([softmax], act * scores)  # `.type(value.dtype)`
    sim.drop(softmax)
    return probs


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
    """GPT2Block.forward: ``ln_1``, the attention (checkpointed alone when ``selective``),
    ``attn_output + residual``, ``ln_2``, the MLP and its dropout, the second sum.  Each
    norm's output dies as ``hidden_states`` is rebound to the sum after it; the branches'
    outputs (``attn_output``, ``feed_forward_hidden_states``), the residual and ``_``
    are locals until the block returns."""
    del index  # every GPT-2 block reads the one causal mask
    tokens, h = recipe.batch * recipe.seq, arch.hidden
    size = recipe.residual * tokens * h
    weights: list[int] = []
    normed = layer_norm(sim, x, tokens, h, recipe)
    if selective:
        attn = sim.checkpoint(
            lambda s, y, held=None: _attention(
                s, y, arch=arch, recipe=recipe, mask=inputs.mask, held=held
            ),
            normed,
            weights,
        )
    else:
        attn = _attention(sim, normed, arch=arch, recipe=recipe, mask=inputs.mask, held=weights)
    mid = sim.op([attn, x], size, alias=True)
    sim.drop(normed)
    normed = layer_norm(sim, mid, tokens, h, recipe)
    down = mlp(sim, normed, arch=arch, recipe=recipe)
    branch = dropped_out(sim, down, recipe, h, arch.hidden_dropout)
    out = sim.op([mid, branch], size, alias=True)
    sim.drop(normed, mid, attn, branch, *weights)
    return out


GPT2 = TraceModel(
    prepare=_prepare,
    block=_block,
    norm=layer_norm,
    parameters=parameters,
    tables=lambda arch: (arch.positions,),
)
