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
from ckpt_core._memory.falcon_trace import DENSE, FALCON, MLP, MLP_NAMES, QKV, qkv_width
from ckpt_core._memory.families.common import (
    dense_block_flops,
    hidden_elements,
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
    dropout,
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
    parallel = bool(config.parallel_attn) or new
    if not parallel and float(config.attention_dropout or 0.0) > 0:
        raise ModelConfigError(
            "Falcon's sequential layer drops out the attention's output by attention_dropout, "
            "which the memory model does not describe: set it to 0",
            field="model.config.attention_dropout",
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
        parallel_attn=parallel,
        falcon_norms=_norms_per_block(config, new),
        bias=bool(config.bias),
        sdpa_math=kv_heads == 1 < heads and not new,
        falcon_grouped=new,
        mlp_names=MLP_NAMES,
    )


def _norms_per_block(config: Any, new: bool) -> int:
    """LayerNorms per Falcon block: 2 (ln_attn + ln_mlp) in the new architecture."""
    if new:
        return 2 if getattr(config, "num_ln_in_parallel_attn", None) in (None, 2) else 1
    return 1 if config.parallel_attn else 2


def _param_layout(arch: Arch) -> ParamLayout:
    h, n, bias = arch.hidden, arch.layers, arch.bias
    linears = (
        Linear(QKV, h, qkv_width(arch), n, bias),
        Linear(DENSE, h, h, n, bias),
        Linear(MLP[0], h, arch.intermediate, n, bias),
        Linear(MLP[1], arch.intermediate, h, n, bias),
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
    two_matrix_mlp(led, arch, step, mlp_in, MLP)
    elements = hidden_elements(arch, step)  # `dropout_add(mlp_output, residual)`
    dropout(led, step, "mlp.out", tag="mlp.dropout_out", p=arch.hidden_dropout, elements=elements)
    return led


def _attention(led: Ledger, arch: Arch, step: Step, x: str) -> None:
    """The fused projection split (`ckpt_core._memory.falcon_trace`); rotary on q and k.
    v is an index copy (multi-query), a flattened copy (the new architecture), or a view
    of the fused output, which it keeps."""
    elem_bytes, tokens, d = step.dtype_bytes, step.tokens, arch.head_dim
    linear(led, step, x, arch.hidden, QKV)
    rope_tables(led, arch, step, sliding=False)
    if arch.kv_heads == arch.heads and not arch.falcon_grouped:
        v = ("attn.qkv", elem_bytes * tokens * qkv_width(arch))
    else:
        v = ("attn.v", elem_bytes * tokens * arch.kv_heads * d)
    out = attention_core(led, arch, step, ("q_rope", "k_rope", *v), mask=_mask(arch, step))
    linear(led, step, out, arch.hidden, DENSE)


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
    trace=lambda arch: FALCON,
    replayed_exactly=lambda arch: True,
)
