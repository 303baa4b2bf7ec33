"""GPT-NeoX (Pythia, GPT-NeoX-20B): partial rotary, fused qkv, two LayerNorms per block.

Everything the memory model knows about GPT-NeoX, in one place.  Its block
(``GPTNeoXLayer``) runs the attention on ``input_layernorm(x)`` and, with
``use_parallel_residual`` (the default), the MLP on
``post_attention_layernorm(x)`` beside it; without, on the norm of ``x`` plus
the attention's output.  ``query_key_value`` makes q, k and v as views of one
storage (per head: q, k, v side by side); RoPE rotates the leading
``partial_rotary_factor`` of q and k and concatenates the rest back, so q and k
are new tensors while v stays a view of the fused output.  Dropout
(``hidden_dropout``) follows the embeddings and each branch, outside the
attention module.  Pure arithmetic.
"""

from __future__ import annotations

from typing import Any

from ckpt_core._memory.arch import Arch, BlockKind, read_activation, read_int
from ckpt_core._memory.attention import attention_core, mask_kind, rope_products
from ckpt_core._memory.costs import lm_head_flops
from ckpt_core._memory.families.common import (
    dense_block_flops,
    hidden_elements,
    layer_norm_lm_head,
    layer_norm_rotary_attention,
    two_matrix_mlp,
)
from ckpt_core._memory.families.decoder_config import read_rotary_dim
from ckpt_core._memory.family import Family, single_stack, uniform_blocks
from ckpt_core._memory.gpt_neox_trace import DENSE, GPT_NEOX, MLP, MLP_NAMES, QKV
from ckpt_core._memory.ledger import (
    GLOBAL,
    BlockMode,
    Ledger,
    Step,
    dropout,
    linear,
    norm,
)
from ckpt_core._memory.param_layout import Linear, ParamLayout, embedding_parameters


def _read_arch(config: Any, model_type: str) -> Arch:
    hidden = read_int(config, "hidden_size")
    heads = read_int(config, "num_attention_heads")
    head_dim = hidden // heads
    attention_bias = bool(getattr(config, "attention_bias", True))
    dropout = float(getattr(config, "hidden_dropout", 0.0) or 0.0)  # embeddings and branches
    return Arch(
        model_type=model_type,
        family="gpt_neox",
        hidden=hidden,
        layers=read_int(config, "num_hidden_layers"),
        heads=heads,
        kv_heads=heads,
        head_dim=head_dim,
        intermediate=read_int(config, "intermediate_size"),
        vocab=read_int(config, "vocab_size"),
        tied=bool(getattr(config, "tie_word_embeddings", False)),
        act=read_activation(config, "hidden_act"),
        glu=False,
        fused_qkv=True,
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=True,
        norm="layer",
        rope_concat=True,
        rotary_dim=read_rotary_dim(config, head_dim),
        attn_dropout=float(getattr(config, "attention_dropout", 0.0) or 0.0),
        hidden_dropout=dropout,
        embed_dropout=dropout,
        parallel_attn=bool(getattr(config, "use_parallel_residual", True)),
        mlp_names=MLP_NAMES,
    )


def _param_layout(arch: Arch) -> ParamLayout:
    h, inter, n = arch.hidden, arch.intermediate, arch.layers
    linears = (
        Linear(QKV, h, 3 * h, n, arch.qkv_bias),
        Linear(DENSE, h, h, n, arch.o_bias),
        Linear(MLP[0], h, inter, n, bias=True),
        Linear(MLP[1], inter, h, n, bias=True),
    )
    norms = n * 2 * 2 * h + 2 * h  # two LayerNorms (weight + bias) per block, the final one
    return ParamLayout(linears, 0, embedding_parameters(arch), norms)


def _embed(arch: Arch, step: Step) -> Ledger:
    led = Ledger()
    if step.trainable_weights:
        led.keep(f"{GLOBAL}ids", 8 * step.tokens)
    elements = hidden_elements(arch, step)
    dropout(led, step, "embed", tag="embed.dropout", p=arch.embed_dropout, elements=elements)
    return led


def _block(arch: Arch, step: Step, mode: BlockMode, kind: BlockKind) -> Ledger:
    led = Ledger()
    attn_in = layer_norm_rotary_attention(
        led, arch, step, mode, mask=_mask(arch, step), attention=_attention
    )
    if attn_in is None:
        return led
    n, p = hidden_elements(arch, step), arch.hidden_dropout
    dropout(led, step, "attn.out", tag="attn.dropout_out", p=p, elements=n)
    mlp_x = "in" if arch.parallel_attn else "mid"  # the block's input, or plus the attention's
    mlp_in = norm(led, step, mlp_x, "ln_mlp", kind="layer", rows=step.tokens, width=arch.hidden)
    two_matrix_mlp(led, arch, step, mlp_in, MLP)
    dropout(led, step, "mlp.out", tag="mlp.dropout_out", p=p, elements=n)
    return led


def _attention(led: Ledger, arch: Arch, step: Step, x: str) -> None:
    """q and k rotated into new tensors; v a view of the fused output, which it keeps."""
    linear(led, step, x, arch.hidden, QKV)
    rope_products(led, arch, step, sliding=False)
    v = ("attn.qkv", 3 * step.dtype_bytes * hidden_elements(arch, step))
    out = attention_core(led, arch, step, ("q_rope", "k_rope", *v), mask=_mask(arch, step))
    linear(led, step, out, arch.hidden, DENSE)


def _mask(arch: Arch, step: Step) -> str | None:
    return mask_kind(arch, step, sliding=False)


FAMILY = Family(
    name="gpt_neox",
    model_types=("gpt_neox",),
    read_arch=_read_arch,
    param_layout=_param_layout,
    stacks=single_stack,
    block_kind=uniform_blocks,
    embed_ledger=_embed,
    head_ledger=layer_norm_lm_head,
    block_ledger=_block,
    block_flops=dense_block_flops,
    head_flops=lm_head_flops,
    trace=lambda arch: GPT_NEOX,
    replayed_exactly=lambda arch: True,
)
