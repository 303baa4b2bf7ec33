"""StableLM's decoder layer (StableLM 2, StableLM-3B-4E1T), for the step replay.

StableLmDecoderLayer normalizes its input (``nn.LayerNorm``) and runs Llama's
attention on it (biased q / k / v, RoPE on the leading slice of each head, cat
with the rest); then either the MLP on the same normed input in parallel
(``use_parallel_residual``: ``residual + attention + mlp``) or, sequentially,
``residual + attention`` and the MLP on its ``post_attention_layernorm``.  The
normed input, the attention's output and the MLP's are locals until the layer
returns.  Its dropout (``hidden_dropout``) is a config error when set, so it is
the identity here.  Sizes in bytes.
"""

from __future__ import annotations

from ckpt_core._memory.arch import Arch
from ckpt_core._memory.autograd_sim import Sim
from ckpt_core._memory.block_trace import attention, mlp
from ckpt_core._memory.fused_trace import layer_norm
from ckpt_core._memory.linear_trace import TraceRecipe
from ckpt_core._memory.model_trace import Inputs, TraceModel, llama_prepare

__all__ = ["STABLELM"]


def _stablelm_layer(
    sim: Sim,
    x: int,
    *,
    arch: Arch,
    recipe: TraceRecipe,
    inputs: Inputs,
    index: int,
    selective: bool = False,
) -> int:
    """StableLmDecoderLayer.forward, parallel (`Arch.parallel_block`) or sequential;
    self_attn is checkpointed alone when ``selective``."""
    tokens, h = recipe.batch * recipe.seq, arch.hidden
    size = recipe.residual * tokens * h
    mask = inputs.layer_mask(arch, index)
    weights: list[int] = []  # `self_attn_output, _ = self.self_attn(...)`
    normed = layer_norm(sim, x, tokens, h, recipe)

    def self_attn(s: Sim, y: int, held: list[int] | None = None) -> int:
        return attention(s, y, arch=arch, recipe=recipe, mask=mask, held=held)

    attn = (
        sim.checkpoint(self_attn, normed, weights) if selective else self_attn(sim, normed, weights)
    )
    if arch.parallel_block:  # `residual + self_attn_output + mlp_output`
        feed_forward = mlp(sim, normed, arch=arch, recipe=recipe)
        partial = sim.op([x, attn], size, alias=True)
        out = sim.op([partial, feed_forward], size, alias=True)
        sim.drop(partial, normed, attn, feed_forward, *weights)
        return out
    mid = sim.op([x, attn], size, alias=True)  # `residual = residual + self_attn_output`
    post = layer_norm(sim, mid, tokens, h, recipe)
    feed_forward = mlp(sim, post, arch=arch, recipe=recipe)
    sim.drop(post)  # the argument's temporary, once the MLP returns
    out = sim.op([mid, feed_forward], size, alias=True)
    sim.drop(normed, attn, feed_forward, mid, *weights)
    return out


STABLELM = TraceModel(prepare=llama_prepare, block=_stablelm_layer, norm=layer_norm)
