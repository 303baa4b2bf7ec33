"""Falcon: rotary, parallel attention and MLP, multi-query or grouped kv heads.

Everything the memory model knows about Falcon, in one place.  transformers
hands Falcon's sdpa a materialized mask at any length.  Pure arithmetic.
"""

from __future__ import annotations

from typing import Any

from ckpt_core._errors import ModelConfigError
from ckpt_core._memory.arch import Arch, BlockKind, read_int
from ckpt_core._memory.attention import attention_core, mask_kind, rope_tables
from ckpt_core._memory.costs import lm_head_flops
from ckpt_core._memory.families.common import (
    dense_block_flops,
    layer_norm_lm_head,
    layer_norm_rotary_attention,
    two_matrix_mlp,
)
from ckpt_core._memory.family import Family, single_stack, uniform_blocks
from ckpt_core._memory.ledger import (
    GLOBAL,
    BlockMode,
    Ledger,
    Step,
    linear,
    norm,
)
from ckpt_core._memory.param_layout import Linear, ParamLayout, embedding_parameters


def _read_arch(config: Any, model_type: str) -> Arch:
    hidden = read_int(config, "hidden_size")
    heads = read_int(config, "num_attention_heads")
    new = bool(config.new_decoder_architecture)
    kv_heads = (
        read_int(config, "num_kv_heads", default=heads)
        if new
        else 1
        if config.multi_query
        else heads
    )
    if bool(getattr(config, "alibi", False)):
        raise ModelConfigError(
            "Falcon with alibi is not described by the memory model (rotary only)",
            field="model.config.alibi",
        )
    return Arch(
        model_type=model_type,
        family="falcon",
        softmax_in_dtype=True,
        hidden=hidden,
        layers=read_int(config, "num_hidden_layers"),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=hidden // heads,
        intermediate=read_int(config, "ffn_hidden_size", default=4 * hidden),
        vocab=read_int(config, "vocab_size"),
        tied=bool(getattr(config, "tie_word_embeddings", True)),
        act="gelu",
        glu=False,
        fused_qkv=True,
        norm="layer",
        attn_dropout=0.0,  # the rotary attention drops nothing out, eager or sdpa
        hidden_dropout=float(config.hidden_dropout or 0.0),
        parallel_attn=bool(config.parallel_attn) or new,
        falcon_norms=_norms_per_block(config, new),
        bias=bool(config.bias),
        sdpa_math=kv_heads == 1 < heads and not new,
    )


def _norms_per_block(config: Any, new: bool) -> int:
    """LayerNorms per Falcon block: 2 (ln_attn + ln_mlp) in the new architecture."""
    if new:
        return 2 if getattr(config, "num_ln_in_parallel_attn", None) in (None, 2) else 1
    return 1 if config.parallel_attn else 2


def _param_layout(arch: Arch) -> ParamLayout:
    h, d, n, bias = arch.hidden, arch.head_dim, arch.layers, arch.bias
    qkv = (arch.heads + 2 * arch.kv_heads) * d
    linears = (
        Linear("self_attention.query_key_value", h, qkv, n, bias),
        Linear("self_attention.dense", h, h, n, bias),
        Linear("mlp.dense_h_to_4h", h, arch.intermediate, n, bias),
        Linear("mlp.dense_4h_to_h", arch.intermediate, h, n, bias),
    )
    norms = n * arch.falcon_norms * 2 * h + 2 * h  # LayerNorms with bias, ln_f
    return ParamLayout(linears, 0, embedding_parameters(arch), norms)


def _embed(arch: Arch, step: Step) -> Ledger:
    led = Ledger()
    if step.trainable_weights:
        led.keep(f"{GLOBAL}ids", 8 * step.tokens)
    return led


def _block(arch: Arch, step: Step, mode: BlockMode, kind: BlockKind) -> Ledger:
    """Falcon: parallel attention and MLP from one (7B) or two (new architecture) norms."""
    led = Ledger()
    attn_in = layer_norm_rotary_attention(
        led, arch, step, mode, mask=_mask(arch, step), attention=_attention
    )
    if attn_in is None:
        return led
    rows, h = step.tokens, arch.hidden
    if not arch.parallel_attn:
        mlp_in = norm(led, step, "mid", "ln_mlp", kind="layer", rows=rows, width=h)
    elif arch.falcon_norms == 2:
        mlp_in = norm(led, step, "in", "ln_mlp", kind="layer", rows=rows, width=h)
    else:
        mlp_in = attn_in  # one norm feeds both branches
    two_matrix_mlp(led, arch, step, mlp_in, ("mlp.dense_h_to_4h", "mlp.dense_4h_to_h"))
    return led


def _attention(led: Ledger, arch: Arch, step: Step, x: str) -> None:
    """Fused qkv split into heads with reshape copies; rotary on q and k."""
    elem_bytes, tokens, d = step.dtype_bytes, step.tokens, arch.head_dim
    linear(led, step, x, arch.hidden, "self_attention.query_key_value")
    rope_tables(led, arch, step, sliding=False)
    v = ("attn.v", elem_bytes * tokens * arch.kv_heads * d)  # transpose + reshape copies v
    out = attention_core(led, arch, step, ("q_rope", "k_rope", *v), mask=_mask(arch, step))
    linear(led, step, out, arch.hidden, "self_attention.dense")


def _mask(arch: Arch, step: Step) -> str | None:
    return mask_kind(arch, step, sliding=False, sdpa_always=True)


FAMILY = Family(
    name="falcon",
    model_types=("falcon",),
    read_arch=_read_arch,
    param_layout=_param_layout,
    stacks=single_stack,
    block_kind=uniform_blocks,
    embed_ledger=_embed,
    head_ledger=layer_norm_lm_head,
    block_ledger=_block,
    block_flops=dense_block_flops,
    head_flops=lm_head_flops,
)
