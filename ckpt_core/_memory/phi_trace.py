"""Phi's decoder layer (Phi-1, 1.5, 2), for the step replay.

PhiDecoderLayer normalizes its input once (``nn.LayerNorm``) and runs the
attention and the MLP on it in parallel, each branch's output dropped out
(``resid_dropout``), then ``attn_outputs + feed_forward_hidden_states +
residual``.  Its attention is Llama's with biases, ``dense`` for o_proj and
RoPE on the leading slice of each head (`Arch.rotary_dim`), cat with the
rest; its MLP ``fc1``, ``gelu_new``, ``fc2``.  PhiModel drops out the
embeddings, and the rebinding frees the lookup.  Sizes in bytes.
"""

from __future__ import annotations

import functools

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.block_trace import attention, mlp
from ckpt_core._memory.fused_trace import dropped_out, layer_norm
from ckpt_core._memory.linear_trace import TraceRecipe
from ckpt_core._memory.model_trace import Inputs, TraceModel, llama_prepare

__all__ = ["PHI"]


def _phi_layer(
    sim: Sim,
    x: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    inputs: Inputs,
    index: int,
    selective: bool = False,
) -> int:
    """PhiDecoderLayer.forward: ``input_layernorm``, self_attn (checkpointed alone when
    ``selective``) and its dropout, the MLP on the same normed input and its dropout (a
    temporary's), then the two sums; the normed input lives until the rebinding."""
    tokens, h = recipe.batch * recipe.seq, arch.hidden
    mask = inputs.layer_mask(arch, index)
    weights: list[int] = []  # `attn_outputs, self_attn_weights = self.self_attn(...)`
    normed = layer_norm(sim, x, tokens, h, recipe)

    def self_attn(s: Sim, y: int, held: list[int] | None = None) -> int:
        return attention(s, y, arch=arch, recipe=recipe, mask=mask, held=held)

    attn = (
        sim.checkpoint(self_attn, normed, weights) if selective else self_attn(sim, normed, weights)
    )
    attn_out = dropped_out(sim, attn, recipe, h, arch.hidden_dropout)
    feed_forward = mlp(sim, normed, arch=arch, recipe=recipe)
    ff_out = dropped_out(sim, feed_forward, recipe, h, arch.hidden_dropout)
    size = recipe.residual * tokens * h
    branches = sim.op([attn_out, ff_out], size, alias=True)
    out = sim.op([branches, x], size, alias=True)
    sim.drop(branches, normed, attn_out, ff_out, *weights)
    return out


PHI = TraceModel(
    prepare=functools.partial(llama_prepare, lookup_local=False),
    block=_phi_layer,
    norm=layer_norm,
)
