"""GPT-NeoX's decoder layer (Pythia, GPT-NeoX-20B), for the step replay.

GPTNeoXLayer runs the attention on ``input_layernorm(x)`` (a temporary) and
drops out its output; with ``use_parallel_residual`` (`Arch.parallel_attn`)
the MLP on ``post_attention_layernorm(x)`` beside it, else on the norm of
``attention + x``; each branch dropped out, then summed.  GPTNeoXAttention's
``query_key_value`` output is viewed per head and chunked into q, k and v
views of one storage (its local ``qkv`` keeps it to the return); RoPE rotates
the leading slice of q and k and cats the rest back.  Its linears are named as
the model names them, for LoRA targets.  Sizes in bytes.
"""

from __future__ import annotations

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.attention_trace import attend
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.block_trace import mlp, rope
from ckpt_core._memory.fused_trace import dropped_out, layer_norm
from ckpt_core._memory.linear_trace import TraceRecipe, linear
from ckpt_core._memory.model_trace import Inputs, TraceModel, llama_prepare

__all__ = ["DENSE", "GPT_NEOX", "MLP", "MLP_NAMES", "QKV"]

QKV = "attention.query_key_value"
DENSE = "attention.dense"
MLP_NAMES = ("dense_h_to_4h", "dense_4h_to_h")  # `Arch.mlp_names`
MLP = tuple(f"mlp.{name}" for name in MLP_NAMES)


def parameters(arch: Arch, index: int) -> list[tuple[str, int, int, int]]:
    """Layer ``index``'s matrices in module order: (name, 0, fan in, fan out)."""
    del index  # every block is alike
    h, inter = arch.hidden, arch.intermediate
    shapes = ((h, 3 * h), (h, h), (h, inter), (inter, h))
    return [(name, 0, *shape) for name, shape in zip((QKV, DENSE, *MLP), shapes, strict=True)]


def _attention(
    sim: Sim,
    x: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    mask: int | None,
    held: list[int] | None = None,
) -> int:
    """GPTNeoXAttention.forward on the normed ``x``: the fused projection and its three
    views (one chunk), RoPE on q and k, the kernel, then ``dense``."""
    tokens, act, h = recipe.batch * recipe.seq, recipe.act, arch.hidden
    qkv = linear(sim, x, QKV, (h, 3 * h), recipe, bias=arch.qkv_bias)
    query, key, value = sim.views(qkv, [act * tokens * h] * 3)
    part = act * tokens * arch.heads * arch.rope_dim
    query_r, key_r = (rope(sim, t, act * tokens * h, concat=True, part=part) for t in (query, key))
    sim.drop(query, key)
    out = attend(
        sim, query_r, key_r, value, arch=arch, recipe=recipe, mask=mask, held=held, output=DENSE
    )
    sim.drop(query_r, key_r, value, qkv)
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
    """GPTNeoXLayer.forward: the attention (checkpointed alone when ``selective``) on a
    normed temporary, its dropout, then the MLP beside it or after it; the branches'
    outputs are locals to the return."""
    tokens, h = recipe.batch * recipe.seq, arch.hidden
    size = recipe.residual * tokens * h
    mask = inputs.layer_mask(arch, index)
    weights: list[int] = []  # `attn_output, _ = self.attention(...)`
    normed = layer_norm(sim, x, tokens, h, recipe)

    def attention(s: Sim, y: int, held: list[int] | None = None) -> int:
        return _attention(s, y, arch=arch, recipe=recipe, mask=mask, held=held)

    attn = (
        sim.checkpoint(attention, normed, weights) if selective else attention(sim, normed, weights)
    )
    sim.drop(normed)  # the argument's temporary
    attn_out = dropped_out(sim, attn, recipe, h, arch.hidden_dropout)
    if arch.parallel_attn:
        mlp_in, residual = layer_norm(sim, x, tokens, h, recipe), x
    else:  # `attn_output = attn_output + hidden_states`
        residual = sim.op([attn_out, x], size, alias=True)
        sim.drop(attn_out)
        attn_out = residual
        mlp_in = layer_norm(sim, residual, tokens, h, recipe)
    down = mlp(sim, mlp_in, arch=arch, recipe=recipe)
    sim.drop(mlp_in)
    mlp_out = dropped_out(sim, down, recipe, h, arch.hidden_dropout)
    if arch.parallel_attn:  # `mlp_output + attn_output + hidden_states`
        partial = sim.op([mlp_out, attn_out], size, alias=True)
        out = sim.op([partial, x], size, alias=True)
        sim.drop(partial)
    else:  # `mlp_output + attn_output`
        out = sim.op([mlp_out, attn_out], size, alias=True)
    sim.drop(mlp_out, attn_out, *weights)
    return out


GPT_NEOX = TraceModel(prepare=llama_prepare, block=_layer, norm=layer_norm, parameters=parameters)
