"""How the decoder family reads its configs: one `Arch` per model.

Llama, Mistral, Mixtral, Qwen2/3 (+ MoE), Phi-3, OLMo-2/3, Gemma (1, 2, 3), GLM(-4),
EXAONE 4 and their kin share one reader; what tells them apart (norms,
sliding layers, RoPE's variants, q / k norms, routed and shared experts) becomes the
`Arch`'s fields, which `ckpt_core._memory.families.decoder` turns into
parameters, ledgers and FLOPs.  Pure Python: reads attributes of the config.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Final

from ckpt_core._errors import ModelConfigError
from ckpt_core._memory.arch import Arch, read_activation, read_int, read_window
from ckpt_core._memory.families.vision import MULTIMODAL, read_vision

# The MLP's input and output projections where they are not Llama's up_proj / down_proj.
_MLP_NAMES: Final = {"starcoder2": ("c_fc", "c_proj"), "phi": ("fc1", "fc2")}


def read_arch(config: Any, model_type: str) -> Arch:
    """The text model's facts; Gemma 3 and Mistral 3 (vision + text) add their vision
    tower's sizes."""
    if model_type not in MULTIMODAL:
        return _text_arch(config, model_type)
    vision = read_vision(config)
    # The model class ties its LM head by its own (top-level) config, not the text one's.
    tied = bool(getattr(config, "tie_word_embeddings", False))
    return replace(_text_arch(config.get_text_config(), model_type), vision=vision, tied=tied)


def _text_arch(config: Any, model_type: str) -> Arch:
    hidden = read_int(config, "hidden_size")
    heads = read_int(config, "num_attention_heads")
    layers = read_int(config, "num_hidden_layers")
    layer_types = tuple(getattr(config, "layer_types", None) or ())
    gemma = model_type.startswith("gemma")
    # Gemma 2 and 3 sandwich each branch in norms; Gemma (1) is Llama's layout, GLM-4
    # Gemma 2's with Llama's RMSNorm.
    glm = model_type in ("glm4", "glm")  # GLM (GLM-4-9B's first release): no sandwich
    sandwiched = (gemma and model_type != "gemma") or model_type == "glm4"
    gpt_oss = model_type == "gpt_oss"
    qwen2_moe = model_type == "qwen2_moe"
    glm4_moe = model_type == "glm4_moe"  # GLM-4.5 / 4.6 and -Air
    # MLA, and GLM-4.5's experts (V3, Kimi K2, GLM-4.7-Flash) or a softmax router (V2)
    deepseek = model_type in ("deepseek_v3", "deepseek_v2", "glm4_moe_lite")
    deepseek_v2 = model_type == "deepseek_v2"
    seed = model_type == "seed_oss"  # Seed-OSS: Llama's layer with biases and dropout
    # StarCoder2: Llama's layer with LayerNorms, a GELU MLP (c_fc, c_proj), biases
    # everywhere (use_bias) and dropout on the embeddings and each branch's output.
    starcoder2 = model_type == "starcoder2"
    # Command R: one CohereLayerNorm per block (fp32, no bias), the attention and MLP in
    # parallel on it, biases on q / k / v / o with attention_bias, optional q / k norms;
    # Command R7B / A (cohere2) add sliding layers, the global ones without RoPE.
    cohere = model_type in ("cohere", "cohere2")
    # StableLM (2): Llama's layer with LayerNorms, biased q / k / v, RoPE on a leading
    # slice of each head, optionally GPT-NeoX's parallel residual.
    stablelm = model_type == "stablelm"
    if stablelm:
        _check_stablelm(config)
    # Phi (1, 1.5, 2): StableLM's parallel layer with a GELU MLP (fc1, fc2), biases on
    # every linear (its attention's output is ``dense``, its LM head biased too), and
    # dropout on the embeddings and each branch's output.
    phi = model_type == "phi"
    if phi and getattr(config, "qk_layernorm", False):
        raise ModelConfigError(
            "Phi's qk_layernorm (a LayerNorm per head) is not described by the memory model",
            field="model.config.qk_layernorm",
        )
    # ERNIE 4.5: fp32 cos / sin, interleaved into copies in every layer (as GLM-4's)
    ernie = model_type == "ernie4_5"
    # Qwen2MoeConfig sets the window to 0 without use_sliding_window; its model still
    # makes a sliding mask with it (unread then), and every layer attends in full.
    unset = qwen2_moe and getattr(config, "sliding_window", None) == 0
    window = 0 if unset else read_window(config)
    # Ministral's and Hunyuan's attention read head_dim as set: without it they do not build.
    required = model_type in ("ministral", "hunyuan_v1_dense")
    default_head_dim = None if required else hidden // heads
    head_dim = read_int(config, "head_dim", default=default_head_dim)
    # Layers list their attention type; Mistral / Phi-3 slide on every layer when a window is set.
    if layer_types:
        sliding = tuple(kind == "sliding_attention" for kind in layer_types)
    else:
        sliding = (window is not None,) * layers
    experts = read_int(config, "num_local_experts", "num_experts", default=0)
    moe_layers = _moe_layers(config, layers) if experts > 1 else (False,) * layers
    olmo = model_type in ("olmo2", "olmo3")  # OLMo-3 is OLMo-2's layer with sliding layers
    post_norms = olmo or model_type == "exaone4"  # EXAONE 4: OLMo-2's layout, Llama's norm
    # gpt-oss scales by its weight in fp32 before the cast back, as OLMo-2 does.
    norm = "rms_gemma" if gemma else "rms_olmo" if olmo or gpt_oss else "rms"
    norm = "layer" if starcoder2 or stablelm or phi else "cohere" if cohere else norm
    bias_key = "qkv_bias" if qwen2_moe else "use_bias" if ernie or starcoder2 else "attention_bias"
    bias_key = "use_qkv_bias" if stablelm else bias_key
    qkv_bias = model_type in ("qwen2", "phi") or bool(getattr(config, bias_key, False))
    kv_heads = read_int(config, "num_key_value_heads", default=heads)
    rotary_dim = read_rotary_dim(config, head_dim)
    if deepseek:  # config.head_dim is the rotated part: q's and k's heads are wider
        rotary_dim = read_int(config, "qk_rope_head_dim")
        head_dim = read_int(config, "qk_nope_head_dim") + rotary_dim
        kv_heads = heads  # k and v are projected per head from the latent
    return Arch(
        model_type=model_type,
        family="decoder",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=read_int(config, "intermediate_size"),
        vocab=read_int(config, "vocab_size"),
        tied=bool(getattr(config, "tie_word_embeddings", False)),
        act=read_activation(config, "hidden_activation", "hidden_act"),
        glu=not (starcoder2 or phi),
        fused_qkv=model_type == "phi3",
        fused_gate_up=model_type == "phi3" or glm,
        qkv_bias=qkv_bias,
        o_bias=_o_bias(config, model_type, qkv_bias),
        norm=norm,
        qk_norm=_qk_norm(config, model_type),
        qk_norm_after_rope=model_type == "hunyuan_v1_dense",
        clip_qkv=model_type == "olmoe" and getattr(config, "clip_qkv", None) is not None,
        sandwich="gemma" if sandwiched else "olmo2" if post_norms else "",
        rope_fp32=olmo or ernie,
        rope_per_kind=model_type in ("gemma3_text", "gemma3", "olmo3"),
        rope_concat=model_type in ("phi3", "glm4", "glm", "glm4_moe", "gpt_oss", "stablelm", "phi"),
        rotary_dim=rotary_dim,
        rope_interleaved=glm or ernie,
        rope_halves=gpt_oss,
        attn_sinks=gpt_oss,
        softmax_in_dtype=gpt_oss,
        attn_softcap=bool(getattr(config, "attn_logit_softcapping", None)),
        final_softcap=bool(getattr(config, "final_logit_softcapping", None)),
        scalar_multipliers=model_type == "granite",
        nope_layers=_nope_layers(config, model_type, window, sliding),
        query_scaling=getattr(config, "model_type", model_type) == "ministral3",
        sliding_window=window
        if any(sliding) or model_type in ("ministral", "qwen2_moe", "cohere2")
        else None,
        sliding_layers=sliding,
        # Ministral, Qwen2-MoE and Command R7B make both whatever; EXAONE 4 the full one
        # whatever, the sliding one when a layer slides.
        both_masks=model_type in ("ministral", "qwen2_moe", "cohere2")
        or (model_type == "exaone4" and any(sliding)),
        moe_layers=moe_layers,
        experts=experts if any(moe_layers) else 0,
        top_k=read_int(config, "num_experts_per_tok", default=0) if any(moe_layers) else 0,
        moe_intermediate=read_int(config, "moe_intermediate_size", "intermediate_size")
        if any(moe_layers)
        else 0,
        router_in_dtype=model_type in ("qwen3_moe", "qwen2_moe", "olmoe", "gpt_oss"),
        # DeepSeek-V2's router never normalizes its top-k weights, whatever the config says.
        norm_topk=not deepseek_v2 and bool(getattr(config, "norm_topk_prob", True)),
        shared_expert_intermediate=_shared_expert_intermediate(config, model_type)
        if any(moe_layers)
        else 0,
        shared_expert_gate=qwen2_moe,
        fp32_router=glm4_moe or deepseek or model_type == "dots1",
        router_group_mask=deepseek_v2
        and getattr(config, "topk_method", None) == "group_limited_greedy",
        rope_complex=deepseek_v2,
        kv_lora_rank=read_int(config, "kv_lora_rank") if deepseek else 0,
        q_lora_rank=read_int(config, "q_lora_rank", default=0) if deepseek else 0,
        v_head_dim=read_int(config, "v_head_dim") if deepseek else 0,
        clamped_swiglu=gpt_oss,
        attn_dropout=float(getattr(config, "attention_dropout", 0.0) or 0.0),
        hidden_dropout=float(
            getattr(config, "residual_dropout" if seed or starcoder2 else "resid_pdrop", 0.0) or 0.0
        ),
        dropout_in_attention=seed or starcoder2,
        embed_dropout=_embed_dropout(config, model_type),
        mlp_bias=phi
        or bool(getattr(config, "use_bias" if ernie or starcoder2 else "mlp_bias", False)),
        mlp_names=_MLP_NAMES.get(model_type, ("up_proj", "down_proj")),
        o_name="dense" if phi else "o_proj",
        head_bias=phi,
        logit_scale=cohere,
        parallel_block=cohere
        or phi
        or (stablelm and bool(getattr(config, "use_parallel_residual", False))),
    )


def _embed_dropout(config: Any, model_type: str) -> float:
    """StarCoder2's and Phi's dropout on the embeddings (Phi-3's config has embd_pdrop,
    which its model does not apply)."""
    key = {"starcoder2": "embedding_dropout", "phi": "embd_pdrop"}.get(model_type)
    return float(getattr(config, key, 0.0) or 0.0) if key else 0.0


def _o_bias(config: Any, model_type: str, qkv_bias: bool) -> bool:
    """o_proj's bias: Seed-OSS's own flag; Phi's always; as q / k / v's, but for the models
    that bias q / k / v only (Qwen2 and Qwen2-MoE, GLM, GLM-4 and 4.5, StableLM)."""
    if model_type == "seed_oss":
        return bool(getattr(config, "attention_out_bias", False))
    if model_type == "phi":
        return True
    only_qkv = ("qwen2", "qwen2_moe", "glm4", "glm", "glm4_moe", "stablelm")
    return qkv_bias and model_type not in only_qkv


def _check_stablelm(config: Any) -> None:
    """StableLM's per-head q / k LayerNorms and its MLP-only dropout are not described:
    an error, rather than an estimate that misses what they keep."""
    if getattr(config, "qk_layernorm", False):
        raise ModelConfigError(
            "StableLM's qk_layernorm (a LayerNorm per head) is not described by the memory model",
            field="model.config.qk_layernorm",
        )
    if float(getattr(config, "hidden_dropout", 0.0) or 0.0) > 0:
        raise ModelConfigError(
            "StableLM's hidden_dropout is not described by the memory model",
            field="model.config.hidden_dropout",
        )


def _moe_layers(config: Any, layers: int) -> tuple[bool, ...]:
    """Which layers route to experts: Qwen-MoE's sparse step and dense-only list, GLM-4.5's
    leading dense layers, GLM-4.7-Flash's ``mlp_layer_types``."""
    kinds = getattr(config, "mlp_layer_types", None)
    if isinstance(kinds, list | tuple) and len(kinds) == layers:
        return tuple(kind == "sparse" for kind in kinds)
    step = read_int(config, "decoder_sparse_step", default=1)
    dense = set(getattr(config, "mlp_only_layers", None) or ())
    first = read_int(config, "first_k_dense_replace", default=0)
    return tuple(i >= first and i not in dense and (i + 1) % step == 0 for i in range(layers))


def _shared_expert_intermediate(config: Any, model_type: str) -> int:
    """The shared expert's width: Qwen2-MoE's own size, GLM-4.5's experts' times their count."""
    if model_type == "qwen2_moe":
        return read_int(config, "shared_expert_intermediate_size", default=0)
    if model_type in ("glm4_moe", "glm4_moe_lite", "deepseek_v3", "deepseek_v2", "dots1"):
        shared = read_int(config, "n_shared_experts", default=0)
        return shared * read_int(config, "moe_intermediate_size")
    return 0


def _nope_layers(
    config: Any, model_type: str, window: int | None, sliding: tuple[bool, ...]
) -> tuple[bool, ...]:
    """Layers that apply no RoPE: SmolLM3's by ``no_rope_layers``; EXAONE 4's and
    Command R7B's (cohere2) global layers once the model has a sliding window."""
    if model_type in ("exaone4", "cohere2"):
        return tuple(window is not None and not slides for slides in sliding)
    return tuple(not use for use in getattr(config, "no_rope_layers", None) or ())


def read_rotary_dim(config: Any, head_dim: int) -> int:
    """The slice of each head RoPE rotates: ``partial_rotary_factor`` of it (Phi-4-mini,
    GLM-4), from the rope parameters transformers standardized."""
    params = getattr(config, "rope_parameters", None)
    factor = params.get("partial_rotary_factor", 1.0) if isinstance(params, dict) else 1.0
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor <= 1:
        raise ModelConfigError(
            f"partial_rotary_factor must be a number in (0, 1], got {factor!r}",
            field="model.config.rope_parameters.partial_rotary_factor",
        )
    return int(head_dim * factor)


def _qk_norm(config: Any, model_type: str) -> str:
    """Qwen3 (and dots.llm1), Gemma 3, EXAONE 4, Hunyuan (and GLM-4.5 with ``use_qk_norm``)
    normalize q and k per head; OLMo-2, OLMo-3 and OLMoE over the whole projections."""
    per_head = (
        "qwen3",
        "qwen3_moe",
        "dots1",
        "gemma3_text",
        "gemma3",
        "exaone4",
        "hunyuan_v1_dense",
    )
    if model_type in per_head:
        return "head"
    if model_type in ("glm4_moe", "cohere") and getattr(config, "use_qk_norm", False):
        return "head"
    return "full" if model_type in ("olmo2", "olmo3", "olmoe") else ""
