"""GPT-2: learned positions, pre-LayerNorm blocks, one fused c_attn, dropout on by default.

Everything the memory model knows about GPT-2, in one place.  Pure arithmetic.
"""

from __future__ import annotations

from typing import Any

from ckpt_core._errors import ModelConfigError
from ckpt_core._memory.arch import Arch, BlockKind, read_activation, read_int
from ckpt_core._memory.attention import attention_core, mask_kind
from ckpt_core._memory.costs import (
    BlockFlops,
    attention_block_flops,
    dense_mlp_flops,
    lm_head_flops,
)
from ckpt_core._memory.families.common import (
    hidden_elements,
    keep_mask,
    layer_norm_lm_head,
    two_matrix_mlp,
)
from ckpt_core._memory.family import Family, single_stack, uniform_blocks
from ckpt_core._memory.gpt2_trace import GPT2
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
    if getattr(config, "add_cross_attention", False):
        # GPT-2 as an encoder-decoder's decoder: cross-attention layers, and an encoder.
        raise ModelConfigError(
            "GPT-2 with add_cross_attention (the decoder of an encoder-decoder model) is not "
            "described by the memory model",
            field="model.config.add_cross_attention",
        )
    hidden = read_int(config, "n_embd", "hidden_size")
    heads = read_int(config, "n_head", "num_attention_heads")
    reorder = bool(getattr(config, "reorder_and_upcast_attn", False))
    return Arch(
        model_type=model_type,
        family="gpt2",
        softmax_in_dtype=not reorder,
        upcast_attention=reorder,
        hidden=hidden,
        layers=read_int(config, "n_layer", "num_hidden_layers"),
        heads=heads,
        kv_heads=heads,
        head_dim=hidden // heads,
        intermediate=read_int(config, "n_inner", default=4 * hidden),
        vocab=read_int(config, "vocab_size"),
        tied=bool(getattr(config, "tie_word_embeddings", True)),
        act=read_activation(config, "activation_function"),
        glu=False,
        fused_qkv=True,
        norm="layer",
        attn_dropout=float(config.attn_pdrop or 0.0),
        hidden_dropout=float(config.resid_pdrop or 0.0),
        embed_dropout=float(config.embd_pdrop or 0.0),
        positions=read_int(config, "n_positions", "max_position_embeddings"),
        bias=True,
        mlp_names=("c_fc", "c_proj"),
    )


def _param_layout(arch: Arch) -> ParamLayout:
    h, inter, n = arch.hidden, arch.intermediate, arch.layers
    linears = (
        Linear("attn.c_attn", h, 3 * h, n, bias=True),
        Linear("attn.c_proj", h, h, n, bias=True),
        Linear("mlp.c_fc", h, inter, n, bias=True),
        Linear("mlp.c_proj", inter, h, n, bias=True),
    )
    norms = n * 4 * h + 2 * h  # ln_1, ln_2 (weight + bias) per block, ln_f
    return ParamLayout(linears, 0, embedding_parameters(arch), norms + arch.positions * h)


def _embed(arch: Arch, step: Step) -> Ledger:
    led = Ledger()
    if step.trainable_weights:
        led.keep(f"{GLOBAL}ids", 8 * step.tokens)
        led.keep(f"{GLOBAL}position_ids", 8 * step.seq)
    dropout(
        led,
        step,
        "embeddings",
        tag="embed.drop",
        p=arch.embed_dropout,
        elements=hidden_elements(arch, step),
    )
    return led


def _block(arch: Arch, step: Step, mode: BlockMode, kind: BlockKind) -> Ledger:
    led = Ledger()
    elem_bytes, n = step.dtype_bytes, hidden_elements(arch, step)
    if mode == "full":
        led.keep("in", elem_bytes * n)
        keep_mask(led, step, _mask(arch, step))
        return led
    x = norm(led, step, "in", "ln_1", kind="layer", rows=step.tokens, width=arch.hidden)
    if mode == "selective":
        led.keep(x, elem_bytes * n)
        keep_mask(led, step, _mask(arch, step))
    else:
        linear(led, step, x, arch.hidden, "attn.c_attn")
        qkv = (
            "attn.qkv",
            "attn.qkv",
            "attn.qkv",
            3 * elem_bytes * n,
        )  # q, k, v: views of one storage
        out = attention_core(led, arch, step, qkv, mask=_mask(arch, step))
        linear(led, step, out, arch.hidden, "attn.c_proj")
        # the residual dropout is inside GPT2Attention (checkpointed with it)
        dropout(led, step, "attn.proj", tag="attn.resid_drop", p=arch.hidden_dropout, elements=n)
    x = norm(led, step, "mid", "ln_2", kind="layer", rows=step.tokens, width=arch.hidden)
    two_matrix_mlp(led, arch, step, x, ("mlp.c_fc", "mlp.c_proj"))
    dropout(led, step, "mlp.out", tag="mlp.drop", p=arch.hidden_dropout, elements=n)
    return led


def _mask(arch: Arch, step: Step) -> str | None:
    return mask_kind(arch, step, sliding=False)


def _block_flops(arch: Arch, step: Step, kind: BlockKind) -> BlockFlops:
    """Residual dropout inside the attention and after the MLP keeps their outputs."""
    dropped = arch.hidden_dropout > 0
    return attention_block_flops(
        arch,
        step,
        mlp=dense_mlp_flops(arch, step),
        attention_kept_after=dropped,
        mlp_kept_after=dropped,
    )


FAMILY = Family(
    name="gpt2",
    model_types=("gpt2",),
    read_arch=_read_arch,
    param_layout=_param_layout,
    stacks=single_stack,
    block_kind=uniform_blocks,
    embed_ledger=_embed,
    head_ledger=layer_norm_lm_head,
    block_ledger=_block,
    block_flops=_block_flops,
    head_flops=lm_head_flops,
    trace=lambda arch: GPT2,
    replayed_exactly=lambda arch: True,
)
