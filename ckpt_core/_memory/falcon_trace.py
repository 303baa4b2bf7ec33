"""Falcon's decoder layer (rotary: Falcon-7B's multi-query, the new architecture's
grouped heads), for the step replay.

FalconDecoderLayer runs the attention on ``input_layernorm(x)`` (the new
architecture's ``ln_attn(x)``, and its ``ln_mlp(x)`` made beside it when it has
two norms); with ``parallel_attn`` the MLP reads a norm of ``x``, else the norm
of ``attention + x``.  In parallel ``mlp_output += attention_output`` (in place),
then ``dropout_add(mlp_output, residual)``.  FalconAttention's fused projection
(a local to the return) is split: q a view; multi-query k and v index copies
(``[..., [-2], :]``); the new architecture's k and v index copies broadcast to
every head and flattened, with q, into copies; RoPE on q and k.  Its sdpa gets
a materialized mask (`ckpt_core._memory.model_trace.layer_masks`), and one key
head makes it torch's math backend (`Arch.sdpa_math`).  Its eager attention
broadcasts the key head through ``matmul``, softmaxes in the dtype and returns
the weights with the layer's output, which the model's loop holds until the
next layer returns (`Inputs.returned`).  Sizes in bytes.
"""

from __future__ import annotations

import functools

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.attention_trace import attend, bmm_operand
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.block_trace import mlp, rope
from ckpt_core._memory.fused_trace import dropout, layer_norm
from ckpt_core._memory.linear_trace import TraceRecipe, linear
from ckpt_core._memory.model_trace import Inputs, TraceModel, llama_prepare

__all__ = ["DENSE", "FALCON", "MLP", "MLP_NAMES", "QKV", "qkv_width"]

QKV = "self_attention.query_key_value"
DENSE = "self_attention.dense"
MLP_NAMES = ("dense_h_to_4h", "dense_4h_to_h")  # `Arch.mlp_names`
MLP = tuple(f"mlp.{name}" for name in MLP_NAMES)


def qkv_width(arch: Arch) -> int:
    """The fused projection's output features: q's heads and k's and v's."""
    return (arch.heads + 2 * arch.kv_heads) * arch.head_dim


def parameters(arch: Arch, index: int) -> list[tuple[str, int, int, int]]:
    """Layer ``index``'s matrices in module order: (name, 0, fan in, fan out)."""
    del index  # every block is alike
    h, inter = arch.hidden, arch.intermediate
    shapes = ((h, qkv_width(arch)), (h, h), (h, inter), (inter, h))
    return [(name, 0, *shape) for name, shape in zip((QKV, DENSE, *MLP), shapes, strict=True)]


def _split(sim: Sim, fused: int, arch: Arch, recipe: TraceRecipe) -> tuple[int, int, int]:
    """FalconAttention._split_heads on the fused projection: (q, k, v)."""
    tokens, act, d = recipe.batch * recipe.seq, recipe.act, arch.head_dim
    q_size, kv_size = act * tokens * arch.heads * d, act * tokens * arch.kv_heads * d
    if arch.kv_heads == arch.heads and not arch.falcon_grouped:  # three views of one storage
        query, key, value = sim.views(fused, [q_size] * 3)
        return query, key, value
    (query,) = sim.views(fused, [q_size])
    # An index copy; its backward makes a gradient of the fused output's size.
    key, value = sim.op([fused], kv_size), sim.op([fused], kv_size)
    if not arch.falcon_grouped:
        return query, key, value
    # broadcast_to every head, then flatten(2, 3): copies (a sum in backward), q's too.
    flat = sim.op([query], q_size, alias=True), sim.op([key], q_size), sim.op([value], q_size)
    sim.drop(query, key, value)
    return flat


def _attention(
    sim: Sim,
    x: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    mask: int | None,
    held: list[int] | None = None,
) -> int:
    """FalconAttention.forward on the normed ``x``: the split projection, RoPE, the kernel,
    then ``dense``; the fused projection and v die as it returns."""
    h = arch.hidden
    fused = linear(sim, x, QKV, (h, qkv_width(arch)), recipe, bias=arch.bias)
    query, key, value = _split(sim, fused, arch, recipe)
    query_r, key_r = (rope(sim, t, sim.size(t)) for t in (query, key))
    sim.drop(query, key)
    if recipe.attention == "eager":
        attn, weights = _eager(sim, query_r, key_r, value, arch=arch, recipe=recipe, mask=mask)
        if held is None:
            sim.drop(weights)
        else:
            held.append(weights)
        out = linear(sim, attn, DENSE, (h, h), recipe, bias=arch.bias)
        sim.drop(attn)
    else:
        out = attend(
            sim, query_r, key_r, value, arch=arch, recipe=recipe, mask=mask, held=held, output=DENSE
        )
    sim.drop(query_r, key_r, value, fused)
    return out


def _eager(
    sim: Sim, query: int, key: int, value: int, *, arch: Arch, recipe: TraceRecipe, mask: int | None
) -> tuple[int, int]:
    """Falcon's eager branch: ``q @ k^T`` (``matmul`` broadcasts the key heads: copies of
    q and of the expanded k^T, or views with batch 1), divided in place, plus the mask,
    softmaxed in the dtype (kept), times v; the output's permute + reshape copies it.
    Returns (output, weights)."""
    tokens, act, batch, seq = recipe.batch * recipe.seq, recipe.act, recipe.batch, recipe.seq
    q_size = act * tokens * arch.heads * arch.head_dim
    scores = act * batch * arch.heads * seq * seq
    query_m, key_m = (bmm_operand(sim, t, q_size, batch) for t in (query, key))
    product = sim.op([query_m, key_m], scores, save=[query_m, key_m], matmul=True)
    sim.drop(*(m for m, t in ((query_m, query), (key_m, key)) if m != t))
    raw = sim.in_place(product, alias=False)  # `/= math.sqrt(head_dim)`
    sim.drop(product)
    masked = sim.op([raw, mask], scores, alias=True) if mask is not None else raw
    weights = sim.op([masked], scores, save_out=True)
    sim.drop(*{masked, raw})  # the sum dies, then the name's rebinding frees the scores
    value_m = bmm_operand(sim, value, q_size, batch)
    out = sim.op([weights, value_m], q_size, save=[weights, value_m], matmul=True)
    if value_m != value:
        sim.drop(value_m)
    flat = sim.op([out], q_size, alias=True)  # view, permute, reshape
    sim.drop(out)
    return flat, weights


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
    """FalconDecoderLayer.forward: the attention (checkpointed alone when ``selective``) on
    a normed temporary, the MLP beside it or after it, the branches summed in place, then
    the residual dropout and add.  Eager's weights are returned with the output."""
    tokens, h = recipe.batch * recipe.seq, arch.hidden
    size = recipe.residual * tokens * h
    mask = inputs.layer_mask(arch, index)
    weights: list[int] = []
    attn_in = layer_norm(sim, x, tokens, h, recipe)
    two_norms = arch.parallel_attn and arch.falcon_norms == 2
    mlp_in = layer_norm(sim, x, tokens, h, recipe) if two_norms else attn_in

    def attention(s: Sim, y: int) -> int:
        # A recompute's weights die with the region's outputs.
        held = None if s.recomputing else weights
        return _attention(s, y, arch=arch, recipe=recipe, mask=mask, held=held)

    attn = sim.checkpoint(attention, attn_in) if selective else attention(sim, attn_in)
    if arch.parallel_attn:
        down = mlp(sim, mlp_in, arch=arch, recipe=recipe)
        total = sim.in_place(down, [attn])  # `mlp_output += attention_output`
        sim.drop(down)
        residual = x
    else:  # `residual = dropout_add(attention_output, residual)`, then the second norm
        residual = sim.op([attn, x], size, alias=True)
        mlp_in = layer_norm(sim, residual, tokens, h, recipe)
        total = mlp(sim, mlp_in, arch=arch, recipe=recipe)
    # `output = dropout_add(mlp_output, residual)`: dropout, then the residual added
    elements = tokens * h
    dropped = dropout(sim, total, recipe.act * elements, elements, arch.hidden_dropout)
    out = sim.op([dropped, residual], size, alias=True)
    sim.drop(*{attn_in, mlp_in, total, dropped}, attn)  # the layer's locals
    if residual != x:
        sim.drop(residual)
    # It returns `(output, attn_weights)`: the model's loop frees the last block's tuple
    # (a recompute's weights died in the attention).
    if not sim.recomputing:
        sim.drop(*inputs.returned)
        inputs.returned[:] = weights
    return out


FALCON = TraceModel(
    prepare=functools.partial(llama_prepare, mask_always=True),
    block=_layer,
    norm=layer_norm,
    parameters=parameters,
)
