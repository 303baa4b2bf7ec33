"""OPT (``model_type`` ``opt``): learned positions, pre-LayerNorm blocks, a ReLU MLP.

Everything the memory model knows about OPT, in one place.  ``OPTDecoderLayer``
runs ``self_attn_layer_norm``, separate biased q / k / v projections (q scaled by
a Python float into a new tensor), attention, ``out_proj``, dropout and the
residual add, then ``final_layer_norm``, ``fc1``, the activation, ``fc2``,
dropout and the add: both dropouts (``dropout``, 0.1 in OPT's configs) are in the
layer, outside the attention module.  The embeddings are not dropped out; the
learned positions (``max_position_embeddings`` + 2 rows: OPT offsets them by 2)
are looked up with per-sample position ids (a cumsum of the attention mask).

OPT-350m's layout (LayerNorms after the residual adds, ``do_layer_norm_before``
false, and embeddings narrower than the blocks, ``word_embed_proj_dim``), LayerNorms
without weights and a removed final LayerNorm are config errors naming the field.
``layerdrop`` skips blocks at random: every block is counted, an upper bound.
Pure arithmetic.
"""

from __future__ import annotations

from typing import Any

from ckpt_core._errors import ModelConfigError
from ckpt_core._memory.arch import Arch, BlockKind, read_activation, read_int
from ckpt_core._memory.attention import attention_core, mask_kind
from ckpt_core._memory.costs import lm_head_flops
from ckpt_core._memory.families.common import (
    dense_block_flops,
    hidden_elements,
    keep_mask,
    layer_norm_lm_head,
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
from ckpt_core._memory.opt_trace import ATTENTION, MLP, OPT, POSITION_OFFSET
from ckpt_core._memory.param_layout import Linear, ParamLayout, embedding_parameters

# (config key, the layout it gives, the value every OPT checkpoint but these has)
_UNMODELLED = (
    ("do_layer_norm_before", "its LayerNorms after the residual adds (OPT-350m)", True),
    ("layer_norm_elementwise_affine", "LayerNorms without weights", True),
    ("_remove_final_layer_norm", "no final LayerNorm", False),
)


def _read_arch(config: Any, model_type: str) -> Arch:
    hidden = read_int(config, "hidden_size")
    heads = read_int(config, "num_attention_heads")
    for key, layout, modelled in _UNMODELLED:
        if getattr(config, key, modelled) != modelled:
            raise ModelConfigError(
                f"OPT with {layout} ({key} {getattr(config, key)!r}) has no memory model; "
                "a dry run with measure works for it",
                field=f"model.config.{key}",
            )
    if read_int(config, "word_embed_proj_dim", default=hidden) != hidden:
        raise ModelConfigError(
            "OPT with embeddings narrower than its blocks (word_embed_proj_dim, OPT-350m) "
            "has no memory model; a dry run with measure works for it",
            field="model.config.word_embed_proj_dim",
        )
    bias = bool(getattr(config, "enable_bias", True))
    return Arch(
        model_type=model_type,
        family="opt",
        hidden=hidden,
        layers=read_int(config, "num_hidden_layers"),
        heads=heads,
        kv_heads=heads,
        head_dim=hidden // heads,
        intermediate=read_int(config, "ffn_dim"),
        vocab=read_int(config, "vocab_size"),
        tied=bool(getattr(config, "tie_word_embeddings", True)),
        act=read_activation(config, "activation_function"),
        glu=False,
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bias,
        o_name="out_proj",
        mlp_names=MLP,
        norm="layer",
        attn_dropout=float(getattr(config, "attention_dropout", 0.0) or 0.0),
        hidden_dropout=float(getattr(config, "dropout", 0.0) or 0.0),
        positions=read_int(config, "max_position_embeddings"),
    )


def _param_layout(arch: Arch) -> ParamLayout:
    h, inter, n = arch.hidden, arch.intermediate, arch.layers
    linears = (
        *(Linear(name, h, h, n, arch.qkv_bias) for name in ATTENTION),
        Linear(MLP[0], h, inter, n, arch.mlp_bias),
        Linear(MLP[1], inter, h, n, arch.mlp_bias),
    )
    norms = n * 2 * 2 * h + 2 * h  # two LayerNorms (weight + bias) per block, the final one
    positions = (arch.positions + POSITION_OFFSET) * h
    return ParamLayout(linears, 0, embedding_parameters(arch), norms + positions)


def _embed(arch: Arch, step: Step) -> Ledger:
    """Token and position lookups, added: only a trained embedding keeps anything (its ids,
    and the positions' per-sample ids offset into a new tensor)."""
    led = Ledger()
    if step.trainable_weights:
        led.keep(f"{GLOBAL}ids", 8 * step.tokens)
        led.keep(f"{GLOBAL}position_ids.offset", 8 * step.tokens)
    return led


def _checkpoint_inputs(led: Ledger, step: Step, mask: str | None) -> None:
    """Besides the hidden states, a checkpointed block or attention keeps the per-sample
    position ids every layer is handed, and the mask."""
    led.keep(f"{GLOBAL}position_ids", 8 * step.tokens)
    keep_mask(led, step, mask)


def _block(arch: Arch, step: Step, mode: BlockMode, kind: BlockKind) -> Ledger:
    led = Ledger()
    elem_bytes, n, h = step.dtype_bytes, hidden_elements(arch, step), arch.hidden
    mask = mask_kind(arch, step, sliding=False)
    if mode == "full":
        led.keep("in", elem_bytes * n)
        _checkpoint_inputs(led, step, mask)
        return led
    x = norm(led, step, "in", "ln_attn", kind="layer", rows=step.tokens, width=h)
    if mode == "selective":
        led.keep(x, elem_bytes * n)
        _checkpoint_inputs(led, step, mask)
    else:
        for name in ATTENTION[:3]:
            linear(led, step, x, h, name)
        # q_proj(x) * scaling: q is the product, k and v the projections' outputs.
        qkv = ("attn.q_scaled", "attn.k", "attn.v", elem_bytes * n)
        out = attention_core(led, arch, step, qkv, mask=mask)
        linear(led, step, out, h, ATTENTION[3])
    dropout(led, step, "attn.out", tag="attn.dropout_out", p=arch.hidden_dropout, elements=n)
    x = norm(led, step, "mid", "ln_mlp", kind="layer", rows=step.tokens, width=h)
    two_matrix_mlp(led, arch, step, x, MLP)
    dropout(led, step, "mlp.out", tag="mlp.dropout_out", p=arch.hidden_dropout, elements=n)
    return led


FAMILY = Family(
    name="opt",
    model_types=("opt",),
    read_arch=_read_arch,
    param_layout=_param_layout,
    stacks=single_stack,
    block_kind=uniform_blocks,
    embed_ledger=_embed,
    head_ledger=layer_norm_lm_head,
    block_ledger=_block,
    block_flops=dense_block_flops,
    head_flops=lm_head_flops,
    trace=lambda arch: OPT,
    replayed_exactly=lambda arch: True,
)
