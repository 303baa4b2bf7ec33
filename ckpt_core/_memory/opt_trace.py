"""OPT's forward for the step replay: per-sample learned positions, LayerNorms, a ReLU MLP.

OPTDecoder.forward: the token lookup, a float all-ones attention mask and its
cumsum into per-sample position ids (handed to every layer), the positions'
lookup (their ids offset by 2 into a new tensor) and the sum; no dropout on the
embeddings.  OPTDecoderLayer: ``self_attn_layer_norm``, OPTAttention (q
projected and scaled into a new tensor, then k and v; ``out_proj``), dropout,
``residual + hidden_states``, ``final_layer_norm``, ``fc1``, the activation
(ReLU keeps its output), ``fc2``, dropout and the second sum; each rebinding
frees what it replaces.  Its linears are named as the model names them, for
LoRA targets.  Sizes in bytes.
"""

from __future__ import annotations

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.attention_trace import attend
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.fused_trace import dropped_out, layer_norm
from ckpt_core._memory.linear_trace import TraceRecipe, linear
from ckpt_core._memory.model_trace import (
    Inputs,
    TraceModel,
    embedding,
    layer_masks,
    lookup_inputs,
)
from ckpt_core._memory.pointwise_trace import scaled

__all__ = ["ATTENTION", "MLP", "OPT", "POSITION_OFFSET"]

# The attention's linears in module order (OPTAttention makes k, v, q, then out_proj).
ATTENTION = tuple(f"self_attn.{name}" for name in ("k_proj", "v_proj", "q_proj", "out_proj"))
MLP = ("fc1", "fc2")  # directly in the layer
POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding's extra rows


def parameters(arch: Arch, index: int) -> list[tuple[str, int, int, int]]:
    """Layer ``index``'s matrices in module order: (name, 0, fan in, fan out)."""
    del index  # every block is alike
    h, inter = arch.hidden, arch.intermediate
    shapes = ((h, h),) * 4 + ((h, inter), (inter, h))
    return [(name, 0, *shape) for name, shape in zip((*ATTENTION, *MLP), shapes, strict=True)]


def _prepare(sim: Sim, arch: Arch, recipe: TraceRecipe, workspace: int) -> Inputs:
    """OPTDecoder.forward up to its first layer; the lookups and the mask of ones are
    locals to the return (adapters: the token lookup is their leaf)."""
    tokens, h = recipe.batch * recipe.seq, arch.hidden
    embeds = embedding(sim, arch, recipe)
    ones = sim.new(4 * tokens)  # torch.ones(batch, seq): float32
    summed = sim.new(4 * tokens)  # cumsum
    product = sim.new(4 * tokens)  # `* mask`
    sim.drop(summed)
    shifted = sim.new(4 * tokens)  # `- 1`
    sim.drop(product)
    ids = sim.new(8 * tokens)  # `.long()`
    sim.drop(shifted)
    masks = layer_masks(sim, arch, recipe)
    offset = sim.new(8 * tokens)  # `position_ids + self.offset`
    size = recipe.residual * tokens * h
    table = recipe.weights * (arch.positions + POSITION_OFFSET) * h
    positions = sim.op([], size, param_grad=table) if recipe.full else sim.new(size)
    if not recipe.full:
        sim.drop(offset)  # a frozen lookup keeps no ids
    hidden = sim.op([embeds, positions], size, alias=True)
    if workspace:  # the first matmul is layer 0's q_proj
        sim.forward_workspace = workspace
    # A trained positions' lookup keeps its offset ids for the backward.
    return lookup_inputs(
        hidden,
        embeds,
        recipe,
        masks=masks,
        ids=ids,
        forward_locals=(positions, ones),
        step_held=(offset,) if recipe.full else (),
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
    """OPTAttention.forward on the normed ``x``: ``q_proj(x) * scaling`` (the projection a
    temporary), k and v, the kernel, ``out_proj``; q, k and v are locals to the return."""
    tokens, act, h = recipe.batch * recipe.seq, recipe.act, arch.hidden
    k_name, v_name, q_name, out_name = ATTENTION
    bias = arch.qkv_bias
    query = scaled(sim, linear(sim, x, q_name, (h, h), recipe, bias=bias), act * tokens * h)
    key = linear(sim, x, k_name, (h, h), recipe, bias=bias)
    value = linear(sim, x, v_name, (h, h), recipe, bias=bias)
    out = attend(
        sim, query, key, value, arch=arch, recipe=recipe, mask=mask, held=held, output=out_name
    )
    sim.drop(query, key, value)
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
    """OPTDecoderLayer.forward (``do_layer_norm_before``); the attention is checkpointed
    alone when ``selective``."""
    del index  # every OPT layer reads the one causal mask
    tokens, act, h = recipe.batch * recipe.seq, recipe.act, arch.hidden
    size = recipe.residual * tokens * h
    weights: list[int] = []  # `hidden_states, _ = self.self_attn(...)`
    normed = layer_norm(sim, x, tokens, h, recipe)

    def attention(s: Sim, y: int, held: list[int] | None = None) -> int:
        return _attention(s, y, arch=arch, recipe=recipe, mask=inputs.mask, held=held)

    attn = (
        sim.checkpoint(attention, normed, weights) if selective else attention(sim, normed, weights)
    )
    sim.drop(normed)
    dropped = dropped_out(sim, attn, recipe, h, arch.hidden_dropout)
    mid = sim.op([x, dropped], size, alias=True)
    sim.drop(dropped)
    normed = layer_norm(sim, mid, tokens, h, recipe)
    up = linear(sim, normed, MLP[0], (h, arch.intermediate), recipe, bias=arch.mlp_bias)
    sim.drop(normed)
    inter = act * tokens * arch.intermediate
    # ReLU keeps its output; other activations their input.
    relu = arch.act == "relu"
    activated = sim.op([up], inter, save=[] if relu else [up], save_out=relu)
    sim.drop(up)
    down = linear(sim, activated, MLP[1], (arch.intermediate, h), recipe, bias=arch.mlp_bias)
    sim.drop(activated)
    dropped = dropped_out(sim, down, recipe, h, arch.hidden_dropout)
    out = sim.op([mid, dropped], size, alias=True)
    sim.drop(dropped, mid, *weights)
    return out


OPT = TraceModel(
    prepare=_prepare,
    block=_layer,
    norm=layer_norm,
    parameters=parameters,
    tables=lambda arch: (arch.positions + POSITION_OFFSET,),
)
