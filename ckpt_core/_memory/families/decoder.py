"""The decoder family: Llama, Mistral, Mixtral, Qwen2/3 (+ MoE), Phi (2, 3), OLMo-2, OLMoE,
Gemma (1, 2, 3), GLM-4 (and 4.5), EXAONE 4 and their kin.

What the memory model knows about these models once their config is read
(`ckpt_core._memory.families.decoder_config`): where their parameters are, what
each op of their forward keeps (RMS norms, rotary attention with GQA, sliding
windows, sandwich norms, q/k norms; the MLPs and experts are
`ckpt_core._memory.families.decoder_mlp`'s), which layer the replay runs, and
their FLOPs.  Gemma 3's vision tower adds weights
only: text-only training never runs it.

Pure arithmetic.
"""

from __future__ import annotations

from dataclasses import replace

from ckpt_core._memory.arch import (
    Arch,
    BlockKind,
)
from ckpt_core._memory.attention import (
    attention_core,
    mask_bytes,
    mask_kind,
    rope_products,
    rope_tables,
)
from ckpt_core._memory.cohere_trace import COHERE
from ckpt_core._memory.costs import (
    BlockFlops,
    attention_block_flops,
    dense_mlp_flops,
    lm_head_flops,
)
from ckpt_core._memory.exaone4_trace import EXAONE4
from ckpt_core._memory.families.common import two_matrix_mlp
from ckpt_core._memory.families.decoder_config import read_arch
from ckpt_core._memory.families.decoder_mlp import (
    adapted_experts,
    clamped_routed_mlp,
    glu_mlp,
    routed_mlp,
)
from ckpt_core._memory.families.mla import (
    mla_attention,
    mla_linears,
    mla_norm_parameters,
    mla_projection_flops,
)
from ckpt_core._memory.families.vision import (
    vision_linears,
    vision_tensors,
)
from ckpt_core._memory.family import Family, single_stack
from ckpt_core._memory.gemma_trace import GEMMA, GEMMA2, GEMMA3
from ckpt_core._memory.glm4_trace import GLM, GLM4
from ckpt_core._memory.ledger import (
    GLOBAL,
    BlockMode,
    Ledger,
    Step,
    causal_loss,
    dropout,
    linear,
    norm,
)
from ckpt_core._memory.model_trace import LAYER_NORMED, LLAMA, TraceModel
from ckpt_core._memory.moe_trace import shared_module
from ckpt_core._memory.olmo2_trace import OLMO2
from ckpt_core._memory.param_layout import (
    Linear,
    ParamLayout,
    embedding_parameters,
)
from ckpt_core._memory.phi_trace import PHI
from ckpt_core._memory.stablelm_trace import STABLELM

# --- parameters -------------------------------------------------------------------


def _param_layout(arch: Arch) -> ParamLayout:
    h, d, n = arch.hidden, arch.head_dim, arch.layers
    q, kv = arch.heads * d, arch.kv_heads * d
    dense = sum(1 for moe in arch.moe_layers if not moe)
    attention = (
        [Linear("self_attn.qkv_proj", h, q + 2 * kv, n)]
        if arch.fused_qkv
        else [
            Linear("self_attn.q_proj", h, q, n, arch.qkv_bias),
            Linear("self_attn.k_proj", h, kv, n, arch.qkv_bias),
            Linear("self_attn.v_proj", h, kv, n, arch.qkv_bias),
        ]
    )
    attention.append(Linear(f"self_attn.{arch.o_name}", q, h, n, arch.o_bias))
    if arch.kv_lora_rank:
        attention = mla_linears(arch)
    mlp_bias = arch.mlp_bias
    inter = arch.intermediate
    up, down = arch.mlp_names
    if arch.fused_gate_up:
        mlp = [
            Linear("mlp.gate_up_proj", h, 2 * inter, dense),
            Linear(f"mlp.{down}", inter, h, dense),
        ]
    else:
        gate = [Linear("mlp.gate_proj", h, inter, dense, mlp_bias)] if arch.glu else []
        mlp = [
            *gate,
            Linear(f"mlp.{up}", h, inter, dense, mlp_bias),
            Linear(f"mlp.{down}", inter, h, dense, mlp_bias),
        ]
    moe = n - dense
    shared, module = arch.shared_expert_intermediate, shared_module(arch)
    if shared:  # the shared expert (and Qwen2-MoE's gate for it), in each MoE layer
        mlp += [
            Linear(f"{module}.gate_proj", h, shared, moe),
            Linear(f"{module}.up_proj", h, shared, moe),
            Linear(f"{module}.down_proj", shared, h, moe),
        ]
        if arch.shared_expert_gate:
            mlp.append(Linear("mlp.shared_expert_gate", h, 1, moe))
    experts = moe * arch.experts * 3 * h * arch.moe_intermediate
    router = moe * arch.experts * h
    if arch.clamped_swiglu:  # gpt-oss: biased router and experts
        experts += moe * arch.experts * (2 * arch.moe_intermediate + h)
        router += moe * arch.experts
    norm_width = 2 * h if arch.norm == "layer" else h  # a LayerNorm's weight and bias
    norms = 1 if arch.parallel_block else {"gemma": 4, "olmo2": 2}.get(arch.sandwich, 2)
    norms_per_block = norms * norm_width
    qk_norm = {"head": 2 * d, "full": q + kv}.get(arch.qk_norm, 0)
    if arch.qk_norm == "head" and arch.norm == "cohere":  # a weight per head: (heads, d)
        qk_norm = q + kv
    sinks = arch.heads if arch.attn_sinks else 0
    latent_norms = mla_norm_parameters(arch) if arch.kv_lora_rank else 0
    final_norm = norm_width
    head_bias = arch.vocab if arch.head_bias else 0
    other = n * (norms_per_block + qk_norm + sinks + latent_norms) + router + final_norm + head_bias
    linears = tuple(item for item in (*attention, *mlp) if item.count)
    idle = sum(elements for elements, _ in vision_tensors(arch))
    layout = ParamLayout(linears, experts, embedding_parameters(arch), other, idle)
    return replace(
        layout,
        idle_linears=vision_linears(arch),
        adapted_parameters=adapted_experts(arch, moe),
        # GLM-4.5's `_keep_in_fp32_modules_strict`: the router's weight, in any load.
        fp32_other=router if arch.fp32_router else 0,
    )


# --- what the forward keeps -------------------------------------------------------


def _block_kind(arch: Arch, stack: int, index: int) -> BlockKind:
    """Sliding-window and MoE layers keep different storages from the others."""
    sliding = bool(arch.sliding_layers) and arch.sliding_layers[index]
    moe = bool(arch.moe_layers) and arch.moe_layers[index]
    return BlockKind(sliding=sliding, moe=moe)


def _embed(arch: Arch, step: Step) -> Ledger:
    led = Ledger()
    if step.trainable_weights:
        led.keep(f"{GLOBAL}ids", 8 * step.tokens)  # the embedding keeps its indices
    # StarCoder2 drops out the embeddings before the first layer.
    dropout(
        led,
        step,
        "embed",
        tag="embed.dropout",
        p=arch.embed_dropout,
        elements=step.tokens * arch.hidden,
    )
    return led


def _head(arch: Arch, step: Step) -> Ledger:
    """Final norm, LM head, (softcapping), fp32 log-softmax of the loss, shifted labels."""
    led = Ledger()
    tokens, elem_bytes, vocab = step.tokens, step.dtype_bytes, arch.vocab
    out = norm(led, step, "in", "final_norm", kind=arch.norm, rows=tokens, width=arch.hidden)
    linear(led, step, out, arch.hidden, "lm_head")
    if arch.final_softcap:
        led.keep("softcap.tanh", elem_bytes * tokens * vocab)
    causal_loss(led, tokens, vocab)
    return led


def _block(arch: Arch, step: Step, mode: BlockMode, kind: BlockKind) -> Ledger:
    led = Ledger()
    elem_bytes, tokens, h = step.dtype_bytes, step.tokens, arch.hidden
    sliding, moe = kind.sliding, kind.moe
    if mode == "full":
        led.keep("in", step.residual_bytes * tokens * h)
        _block_inputs(led, arch, step, sliding)
        return led
    olmo = arch.sandwich == "olmo2"
    attn_in = "in" if olmo else norm(led, step, "in", "ln_in", kind=arch.norm, rows=tokens, width=h)
    if mode == "selective":
        led.keep(attn_in, elem_bytes * tokens * h)
        _block_inputs(led, arch, step, sliding)
    elif arch.kv_lora_rank:
        mla_attention(led, arch, step, attn_in, sliding)
    else:
        _attention(led, arch, step, attn_in, sliding)
    # Residual dropout on each branch's output (Phi-3's and Phi's in the layer, Seed-OSS's
    # inside self_attn, whose checkpoint recomputes it) keeps a mask.
    p = arch.hidden_dropout
    if mode != "selective" or not arch.dropout_in_attention:
        dropout(led, step, "attn.out", tag="attn.resid_dropout", p=p, elements=tokens * h)
    if arch.sandwich:
        norm(led, step, "attn.out", "ln_post_attn", kind=arch.norm, rows=tokens, width=h)
    if arch.parallel_block:  # Cohere's and Phi's MLP read the attention's normed input too
        mlp_in = attn_in
    elif arch.sandwich == "gemma":
        mlp_in = norm(led, step, "mid", "ln_pre_mlp", kind=arch.norm, rows=tokens, width=h)
    elif olmo:
        mlp_in = "mid"
    else:
        mlp_in = norm(led, step, "mid", "ln_post", kind=arch.norm, rows=tokens, width=h)
    if moe and arch.clamped_swiglu:
        clamped_routed_mlp(led, arch, step, mlp_in)
    elif moe:
        routed_mlp(led, arch, step, mlp_in)
    elif arch.glu:
        glu_mlp(led, arch, step, mlp_in)
    else:
        two_matrix_mlp(led, arch, step, mlp_in, tuple(f"mlp.{name}" for name in arch.mlp_names))
    dropout(led, step, "mlp.out", tag="mlp.resid_dropout", p=p, elements=tokens * h)
    if arch.sandwich:
        norm(led, step, "mlp.out", "ln_post_mlp", kind=arch.norm, rows=tokens, width=h)
    return led


def _block_inputs(led: Ledger, arch: Arch, step: Step, sliding: bool) -> None:
    """Tensors a checkpointed block or attention keeps besides its hidden states."""
    rope_tables(led, arch, step, sliding)
    led.keep(f"{GLOBAL}position_ids", 8 * step.seq)
    mask = mask_kind(arch, step, sliding)
    if mask is not None:
        led.keep(f"{GLOBAL}mask.{mask}", mask_bytes(step, mask))


def _attention(led: Ledger, arch: Arch, step: Step, x: str, sliding: bool) -> None:
    elem_bytes, tokens, h, d = step.dtype_bytes, step.tokens, arch.hidden, arch.head_dim
    q, kv = arch.heads * d, arch.kv_heads * d
    if arch.fused_qkv:
        linear(led, step, x, h, "self_attn.qkv_proj")
        q_raw = k_raw = v = "qkv"
        v_bytes = elem_bytes * tokens * (q + 2 * kv)
    else:
        for name in ("q_proj", "k_proj", "v_proj"):
            linear(led, step, x, h, f"self_attn.{name}")
        q_raw, k_raw, v, v_bytes = "q_raw", "k_raw", "v", elem_bytes * tokens * kv
    if arch.qk_norm == "head":
        # Cohere's weight has a row per head; the others' one row of ``d``.
        per_head = arch.norm == "cohere"
        for raw, tag, heads in ((q_raw, "q_norm", arch.heads), (k_raw, "k_norm", arch.kv_heads)):
            weight = heads * d if per_head else d
            norm(led, step, raw, tag, kind=arch.norm, rows=tokens * heads, width=d, weight=weight)
    elif arch.qk_norm == "full":  # OLMo-2 normalizes the whole projections
        norm(led, step, q_raw, "q_norm", kind=arch.norm, rows=tokens, width=q)
        norm(led, step, k_raw, "k_norm", kind=arch.norm, rows=tokens, width=kv)
    if arch.clip_qkv:  # OlmoeAttention: `query_states.clamp_(...)`, and k's and v's
        for name, width in (("q", q), ("k", kv), ("v", kv)):
            led.keep(f"{name}.clamped", elem_bytes * tokens * width)
    rope_products(led, arch, step, sliding)
    if arch.query_scaling:  # `query_states * scale`: the product replaces the rotated q
        led.keep("q_scale", elem_bytes * step.seq)
    mask = mask_kind(arch, step, sliding)
    out = attention_core(led, arch, step, ("q_rope", "k_rope", v, v_bytes), mask=mask)
    linear(led, step, out, q, f"self_attn.{arch.o_name}")


# --- FLOPs ------------------------------------------------------------------------


def _block_flops(arch: Arch, step: Step, kind: BlockKind) -> BlockFlops:
    """Routed experts' multiply by the routing weights keeps their output; post-norms
    (Gemma, OLMo-2) and dropout keep the MLP's."""
    if kind.moe:
        h, shared = arch.hidden, arch.shared_expert_intermediate
        routed = arch.experts + arch.top_k * 3 * arch.moe_intermediate
        gate = 1 if arch.shared_expert_gate else 0
        mlp = 2 * step.tokens * h * (routed + (3 * shared + gate if shared else 0))
        kept_after = True
    else:
        mlp = dense_mlp_flops(arch, step)
        kept_after = bool(arch.sandwich) or arch.hidden_dropout > 0
    projections = mla_projection_flops(arch, step) if arch.kv_lora_rank else None
    return attention_block_flops(
        arch,
        step,
        mlp=mlp,
        attention_kept_after=arch.dropout_in_attention and arch.hidden_dropout > 0,
        mlp_kept_after=kept_after,
        projections=projections,
    )


_TRACES: dict[str, TraceModel] = {
    "gemma": GEMMA,
    "gemma2": GEMMA2,
    "gemma3_text": GEMMA3,
    "gemma3": GEMMA3,
    "olmo2": OLMO2,
    "olmo3": OLMO2,
    "exaone4": EXAONE4,
    "glm4": GLM4,
    "glm": GLM,
    "cohere": COHERE,
    "cohere2": COHERE,
    "starcoder2": LAYER_NORMED,
    "phi": PHI,
    "stablelm": STABLELM,
}


def _trace(arch: Arch) -> TraceModel:
    """Gemma 2's, Gemma 3's, OLMo-2's, EXAONE 4's, GLM-4's and GLM's layers (sandwich or
    post-norms, q / k norms, sliding masks, logit softcapping, fp32 or partial RoPE)
    are replayed as their own (OLMo-3 runs OLMo-2's, its sliding layers reading their
    mask), StarCoder2's as Llama's with LayerNorms, Phi's and StableLM's as their own;
    every other decoder as Llama's block at its sizes."""
    return _TRACES.get(arch.model_type, LLAMA)


def _replayed_exactly(arch: Arch) -> bool:
    """Every dense decoder but MLA's and Command R's with q / k norms (its layer without
    them).  MoE models take the closed form's allocated peak and the
    pool of a replay that runs their experts (`ckpt_core._memory.moe_trace`) in Llama's
    block: gpt-oss's, GLM-4.5's and DeepSeek's routers at the top-k softmax's sizes."""
    return (
        not arch.is_moe and not arch.kv_lora_rank and not (arch.norm == "cohere" and arch.qk_norm)
    )


FAMILY = Family(
    name="decoder",
    model_types=(
        "llama",
        "granite",
        "smollm3",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "qwen2_moe",
        "olmoe",
        "glm4_moe",
        "glm4_moe_lite",
        "seed_oss",
        "ernie4_5",
        "deepseek_v3",
        "deepseek_v2",
        "dots1",
        "gpt_oss",
        "phi3",
        "olmo2",
        "olmo3",
        "exaone4",
        "glm4",
        "glm",
        "starcoder2",
        "cohere",
        "cohere2",
        "stablelm",
        "phi",
        "hunyuan_v1_dense",
        "gemma",
        "gemma2",
        "gemma3_text",
        "gemma3",
        "mistral3",
        "ministral",
        "ministral3",
    ),
    read_arch=read_arch,
    param_layout=_param_layout,
    stacks=single_stack,
    block_kind=_block_kind,
    embed_ledger=_embed,
    head_ledger=_head,
    block_ledger=_block,
    block_flops=_block_flops,
    head_flops=lm_head_flops,
    # Gemma 2's softcapping: transformers falls back to eager; gpt-oss's model class has
    # no sdpa (its flash path runs, passing the sinks to kernels that take them).
    no_sdpa=frozenset({"gemma2", "gpt_oss"}),
    no_flash=frozenset({"gemma3"}),
    moe_types=frozenset(
        {
            "deepseek_v2",
            "deepseek_v3",
            "dots1",
            "glm4_moe",
            "glm4_moe_lite",
            "gpt_oss",
            "mixtral",
            "olmoe",
            "qwen2_moe",
            "qwen3_moe",
        }
    ),
    trace=_trace,
    replayed_exactly=_replayed_exactly,
    idle_tensors=vision_tensors,
)
