"""The memory model: exact parameter counts, closed-form activations vs the meta measurement,
storage and optimizer arithmetic, LoRA through PEFT, recompute FLOPs vs FlopCounterMode.

The closed form writes down what each op keeps, so it agrees with the meta
measurement to well under the 10% the contract asks; the tests hold it to 2%
to catch regressions.  The bench (``bench/estimate.py``) covers every preset.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Final

import pytest
import torch

from ckpt_core import InvalidWorkloadError, ModelConfigError, make_plan
from ckpt_core._configs.model_config import build_meta_model, count_parameters, load_model_config
from ckpt_core._configs.presets import load_preset, preset_names
from ckpt_core._memory.activations import activation_bytes
from ckpt_core._memory.families import NO_FLASH, NO_SDPA, arch_of, family_of
from ckpt_core._memory.flops import recompute_ratio
from ckpt_core._memory.inputs import Run, model_facts, parse_workload, prepare
from ckpt_core._memory.ledger import Step
from ckpt_core._meta.measure import measure_activation_bytes
from tests._model_configs import (
    COHERE,
    COHERE2,
    DEEPSEEK_V2_GROUPED,
    DEEPSEEK_V2_LITE,
    DEEPSEEK_V3,
    DOTS1,
    DOTS1_WINDOWED,
    ERNIE4_5,
    EXAONE4,
    GEMMA,
    GLM,
    GLM4,
    GLM4_MOE,
    GLM4_MOE_GROUPED,
    GLM4_MOE_LITE,
    GPT_NEOX,
    GPT_NEOX_SEQUENTIAL,
    GPT_OSS,
    GRANITE,
    HUNYUAN,
    MINISTRAL,
    MINISTRAL3,
    MISTRAL3,
    MOONLIGHT,
    MT5_BASE,
    OLMO3,
    OLMOE,
    OLMOE_CLIPPED,
    OPT,
    PHI,
    QWEN2_MOE,
    QWEN2_MOE_SPARSE,
    SEED_OSS,
    SMOLLM3,
    STABLELM,
    STABLELM_PARALLEL,
    STARCODER2,
)
from tests._tiny_models import as_loaded, tiny_model

TIERS = ("off", "selective", "medium", "full")
TOLERANCE = 0.02  # the contract is 10%


@functools.cache
def meta_model(preset: str, attention: str = "sdpa") -> torch.nn.Module:
    config = load_model_config({"preset": preset})
    try:
        return build_meta_model(config, attention=attention)
    except Exception:  # no sdpa for this architecture (Gemma 2): transformers runs eager
        return build_meta_model(config, attention="eager")


def run_for(preset: str, **workload: Any) -> Run:
    return prepare(model_facts({"preset": preset}), parse_workload(workload))


def assert_estimate_matches(preset: str, tiers: tuple[str, ...] = TIERS, **workload: Any) -> None:
    run = run_for(preset, **workload)
    model = meta_model(preset, workload.get("attention", "sdpa"))
    for tier in tiers:
        measured = measure_activation_bytes(
            model,
            tier,
            seq_len=workload["seq_len"],
            micro_batch_size=workload.get("micro_batch_size", 1),
            dtype=workload.get("dtype", "bf16"),
            attention=workload.get("attention", "sdpa"),
            padded=workload.get("padded", False),
        )
        estimated = activation_bytes(run.facts.arch, run.step, tier)
        assert estimated == pytest.approx(measured, rel=TOLERANCE), (preset, workload, tier)


@pytest.mark.parametrize("preset", preset_names())
def test_parameter_count_is_exact_for_every_preset(preset: str) -> None:
    assert model_facts({"preset": preset}).layout.total == count_parameters(meta_model(preset))


@pytest.mark.parametrize("preset", preset_names())
def test_attention_support_table_matches_the_model_classes(preset: str) -> None:
    cls = type(meta_model(preset))
    model_type = model_facts({"preset": preset}).arch.model_type
    assert (model_type not in NO_SDPA) == cls._supports_sdpa
    assert (model_type not in NO_FLASH) == cls._supports_flash_attn


@pytest.mark.parametrize("preset", preset_names())
def test_fp32_module_table_matches_the_model_classes(preset: str) -> None:
    """What transformers keeps in fp32 on load: the family's table (under fp16), and
    nothing kept in bf16 too (``_keep_in_fp32_modules_strict``), which the estimate lacks."""
    cls = type(meta_model(preset))
    family = family_of(model_facts({"preset": preset}).arch)
    assert family.keep_in_fp32 == set(cls._keep_in_fp32_modules or ())
    assert not cls._keep_in_fp32_modules_strict


def _loaded_bytes(model: torch.nn.Module, kept: set[str], *, other: int, fp32: int) -> int:
    """Parameter bytes, those of modules named in ``kept`` at ``fp32`` bytes each."""
    return sum(
        p.numel() * (fp32 if kept & set(name.split(".")) else other)
        for name, p in model.named_parameters()
    )


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_t5_loaded_in_fp16_keeps_wo_in_fp32(attention: str, padded: bool) -> None:
    """``from_pretrained(dtype=torch.float16)`` keeps T5's ``wo`` in fp32
    (``_keep_in_fp32_modules``): its weights, gradients and AdamW states are fp32; its
    input is cast to fp32 and its output is fp32, so from the first feed-forward on the
    residual stream is fp32, and only each stack's first block clamps an fp16 residual.
    The activations equal the meta measurement to the byte (they were 18% low on
    selective and full)."""
    model = meta_model("t5-base", attention)
    kept = set(type(model)._keep_in_fp32_modules)
    loaded = _loaded_bytes(model, kept, other=2, fp32=4)
    shape = {"seq_len": 512, "micro_batch_size": 2, "attention": attention}
    run = run_for("t5-base", dtype="fp16", padded=padded, **shape)
    assert (run.static.weights, run.static.gradients) == (loaded, loaded)
    assert run.static.optimizer == 2 * loaded  # exp_avg and exp_avg_sq: zeros_like
    for tier in TIERS:
        measured = measure_activation_bytes(model, tier, dtype="fp16", padded=padded, **shape)
        estimated = activation_bytes(run.facts.arch, run.step, tier)
        assert estimated == measured, tier


@pytest.mark.parametrize(
    ("dtype", "preparation", "other_bytes", "wo_bytes"),
    [
        ("bf16", "peft", 4, 4),
        ("fp16", "peft", 4, 4),
        ("bf16", "none", 2, 2),
        ("fp16", "none", 2, 4),
    ],
)
def test_bitsandbytes_leaves_t5_wo_unquantized(
    dtype: str, preparation: str, other_bytes: int, wo_bytes: int
) -> None:
    """transformers' bitsandbytes quantizers never convert ``_keep_in_fp32_modules``,
    whatever the dtype, so T5's ``wo`` stays a plain linear: fp32 when loaded in fp16
    or after PEFT's kbit preparation (which casts every unquantized parameter to fp32),
    else in the dtype.  The other block linears are nf4 (0.5 B + an fp32 absmax per 64)."""
    model = meta_model("t5-base")
    kept = set(type(model)._keep_in_fp32_modules)
    workload = {"seq_len": 512, "dtype": dtype, "method": "qlora", "kbit_preparation": preparation}
    run = prepare(model_facts({"preset": "t5-base"}), parse_workload(workload))
    block_linears = {
        f"{name}.weight"
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and ".block." in name
    }
    quantized = sum(
        p.numel()
        for name, p in model.named_parameters()
        if name in block_linears and not kept & set(name.split("."))
    )
    unquantized = _loaded_bytes(model, kept, other=other_bytes, fp32=wo_bytes)
    unquantized -= quantized * other_bytes
    adapters = run.static.trainable_parameters * 4
    assert run.static.weights == quantized * (0.5 + 4 / 64) + unquantized + adapters


ATTENTION_TARGETS: Final = ["q_proj", "k_proj", "v_proj", "o_proj"]


@pytest.mark.parametrize(
    ("model_input", "targets"),
    [
        ({"preset": "gemma-3-4b"}, ATTENTION_TARGETS),
        ({"config": MISTRAL3}, ATTENTION_TARGETS),
        ({"preset": "bert-base-uncased"}, ["query", "value"]),
    ],
    ids=["gemma3", "mistral3", "bert"],
)
def test_bitsandbytes_quantizes_every_linear_but_the_output_embeddings(
    model_input: dict[str, Any], targets: list[str]
) -> None:
    """transformers' bitsandbytes integration converts every ``nn.Linear`` but the output
    embeddings (``get_keys_to_not_convert``): an idle vision tower's and its projector's
    (Gemma 3, Mistral 3) and BERT's masked-LM head transform too.  nf4 is 0.5 B plus an
    fp32 absmax per 64 weights; PEFT's kbit preparation casts every other parameter to
    fp32; the adapters (on the attention's projections) are fp32."""
    model = build_meta_model(load_model_config(model_input), attention="sdpa")
    output = model.get_output_embeddings()
    linears = {
        f"{name}.weight"
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not output
    }
    params = dict(model.named_parameters())
    quantized = sum(p.numel() for name, p in params.items() if name in linears)
    others = sum(p.numel() for name, p in params.items() if name not in linears)
    workload = {"seq_len": 512, "method": "qlora", "lora_rank": 16, "lora_targets": targets}
    run = prepare(model_facts(model_input), parse_workload(workload))
    adapters = run.static.weights - quantized * (0.5 + 4 / 64) - others * 4
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=16, target_modules=targets))
    lora = sum(p.numel() for name, p in peft_model.named_parameters() if "lora_" in name)
    assert adapters == lora * 4


# One preset per family and feature: dense GQA, MoE, sliding window + fused qkv,
# sandwich norms + one kv head + sliding window, OLMo-2 q/k norms, parallel MQA
# (Falcon), a vision-language model, encoder-decoder.  GPT-2 and BERT stop at
# their learned positions.
REPRESENTATIVE = (
    "llama-3.2-1b",
    "qwen3-30b-a3b",
    "phi-3-mini",
    "gemma-3-1b",
    "olmo-2-7b",
    "falcon-7b",
    "gemma-3-4b",
    "t5-base",
)


@pytest.mark.parametrize("preset", REPRESENTATIVE)
@pytest.mark.parametrize("seq_len", [1024, 4096, 16384])
def test_estimate_matches_meta_measurement(preset: str, seq_len: int) -> None:
    assert_estimate_matches(preset, seq_len=seq_len)


@pytest.mark.parametrize(("preset", "seq_len"), [("gpt2", 1024), ("bert-base-uncased", 512)])
def test_estimate_matches_with_learned_positions_and_dropout(preset: str, seq_len: int) -> None:
    assert_estimate_matches(preset, seq_len=seq_len)


@pytest.mark.parametrize("batch", [1, 2])
def test_gpt2_upcast_attention_keeps_fp32_copies_of_q_and_k(batch: int) -> None:
    """GPT-2 with ``reorder_and_upcast_attn`` runs eager attention as a baddbmm of fp32
    copies of q and k, which its backward keeps, and the softmax in fp32: the estimate
    equals the meta measurement on every tier (it was below by those copies)."""
    model_input = {"config": {**load_preset("gpt2"), "reorder_and_upcast_attn": True}}
    model = build_meta_model(load_model_config(model_input), attention="eager")
    facts = model_facts(model_input)
    shape = {"seq_len": 512, "micro_batch_size": batch, "attention": "eager"}
    run = prepare(facts, parse_workload(shape))
    plain = prepare(model_facts({"preset": "gpt2"}), parse_workload(shape))
    for tier in TIERS:
        measured = measure_activation_bytes(model, tier, **shape)
        # to the byte but for a scalar the measurement sees
        assert activation_bytes(facts.arch, run.step, tier) == pytest.approx(measured, abs=64)
    assert activation_bytes(facts.arch, run.step, "off") > activation_bytes(
        plain.facts.arch, plain.step, "off"
    )


@pytest.mark.parametrize("batch", [1, 2])
def test_falcon_multi_query_sdpa_runs_the_math_kernel(batch: int) -> None:
    """Falcon-7B hands sdpa its one key head without ``enable_gqa``: no fused CUDA kernel
    takes that, so torch runs the math backend, which keeps fp32 copies of q, k and v
    (k and v repeated to every head but with batch 1) and the fp32 softmax per layer.
    The meta measurement runs that backend for such a call; the estimate equals it on
    every tier (it counted a fused kernel: half the real order without checkpointing)."""
    shape = {"seq_len": 512, "micro_batch_size": batch, "attention": "sdpa"}
    run = run_for("falcon-7b", **shape)
    model = meta_model("falcon-7b", "sdpa")
    arch = run.facts.arch
    for tier in TIERS:
        measured = measure_activation_bytes(model, tier, **shape)
        # to the byte but for 0-dim scalars the measurement sees (each layer's products
        # keep their scale factors: doubles, on the host when the tensors are on CUDA)
        estimated = activation_bytes(arch, run.step, tier)
        assert estimated == pytest.approx(measured, abs=32 * arch.layers), tier
    softmax = 4 * batch * arch.heads * 512 * 512
    assert activation_bytes(arch, run.step, "off") > arch.layers * softmax


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("preset", ["llama-3.2-1b", "gemma-3-1b"])
def test_grouped_heads_in_fp32_run_sdpas_math_backend(preset: str, batch: int) -> None:
    """Without a mask transformers hands sdpa grouped kv heads with ``enable_gqa``, which
    among the fused kernels only flash takes, and only in fp16 / bf16: fp32 q (a fp32
    step, or after PEFT's kbit preparation) runs the math backend, which repeats k and v
    to every head in fp32 and keeps the fp32 softmax.  The meta measurement runs it; the
    estimate equals it on every tier (Gemma 3's sliding layers, masked at seq 1024, keep
    the fused kernel), and is above the fused kernel's."""
    shape = {"seq_len": 1024, "micro_batch_size": batch, "attention": "sdpa", "dtype": "fp32"}
    run = run_for(preset, **shape)
    assert run.step.gqa == "math"
    model = meta_model(preset, "sdpa")
    for tier in TIERS:
        measured = measure_activation_bytes(model, tier, **shape)
        # to the byte but for 0-dim scalars the measurement sees (on the host on CUDA)
        estimated = activation_bytes(run.facts.arch, run.step, tier)
        assert estimated == pytest.approx(measured, abs=32 * run.facts.arch.layers), tier
    fused = dataclasses.replace(run.step, gqa="native")
    assert activation_bytes(run.facts.arch, run.step, "off") > activation_bytes(
        run.facts.arch, fused, "off"
    )


@pytest.mark.parametrize(
    ("preset", "workload", "gpu", "kind"),
    [
        ("llama-3.2-1b", {}, "H100-80GB", "native"),  # flash takes bf16 grouped heads
        ("llama-3.2-1b", {}, None, "native"),  # an unnamed GPU: from compute capability 8
        ("llama-3.2-1b", {}, "T4", "math"),  # no flash kernel below compute capability 8
        ("llama-3.2-1b", {"dtype": "fp16"}, "V100-32GB", "math"),
        ("llama-3.2-1b", {"dtype": "fp32"}, "H100-80GB", "math"),  # flash: fp16 / bf16 only
        ("llama-3.2-1b", {"dtype": "fp32", "compute": "loaded"}, "A100-80GB", "math"),
        ("llama-3.2-1b", {"method": "qlora"}, "H100-80GB", "math"),  # fp32 after kbit prep
        ("llama-3.2-1b", {"method": "qlora", "compute": "autocast"}, "H100-80GB", "native"),
        ("llama-3.2-1b", {"method": "qlora", "kbit_preparation": "none"}, "A10", "native"),
        (
            "llama-3.2-1b",
            {"dtype": "fp32", "compute": "loaded", "sdpa_backend": "efficient"},
            "T4",
            "repeated",
        ),
        ("llama-3.2-1b", {"attention": "eager"}, "T4", "native"),
        ("llama-3.2-1b", {"attention": "flash_attention_2"}, "H100-80GB", "native"),
        ("gpt2", {"dtype": "fp32"}, "T4", "native"),  # as many kv heads as query heads
        ("falcon-7b", {}, "T4", "native"),  # its one key head: `Arch.sdpa_math`
    ],
)
def test_sdpa_runs_grouped_heads_as_the_gpu_and_dtype_allow(
    preset: str, workload: dict[str, Any], gpu: str | None, kind: str
) -> None:
    """`gqa_kind`: grouped kv heads without a mask reach sdpa with ``enable_gqa``, which
    only flash takes (fp16 / bf16, compute capability 8 and up); else the math backend
    runs.  A pinned memory-efficient kernel gets them repeated."""
    run = prepare(
        model_facts({"preset": preset}), parse_workload({"seq_len": 512, **workload}), gpu
    )
    assert run.step.gqa == kind


def test_the_gpus_without_flash_are_in_the_gpu_table() -> None:
    from ckpt_core._planning.gpus import GPUS, NO_FLASH_SDPA

    assert {spec.name for spec in GPUS} > NO_FLASH_SDPA


def test_a_t4_estimate_of_grouped_heads_counts_the_math_backend() -> None:
    """llama-3.2-1b LoRA at seq 2048 on a T4 with transformers' default sdpa: without
    checkpointing each of its 16 layers keeps the math backend's fp32 softmax, which the
    same job on an L4 (flash) does not; the answer says which kernel runs."""
    workload = {"seq_len": 2048, "method": "lora"}
    t4 = make_plan("full", gpu="T4", model={"preset": "llama-3.2-1b"}, workload=workload)
    l4 = make_plan("full", gpu="L4", model={"preset": "llama-3.2-1b"}, workload=workload)
    softmax = 4 * 32 * 2048 * 2048  # fp32, heads x seq x seq
    allocated = (plan.estimate["tiers"]["off"]["allocated_bytes"] for plan in (t4, l4))
    assert next(allocated) - next(allocated) > 16 * softmax
    assert "math backend" in t4.estimate["assumptions"]["attention_note"]
    assert l4.estimate["assumptions"]["attention_note"] == ""


def test_phi3_residual_dropout_keeps_a_mask_per_branch() -> None:
    """Phi-3 drops out each branch's output in the layer, outside self_attn: with
    ``resid_pdrop`` the masks are kept even by a selective block (they were missed)."""
    model_input = {"config": {**load_preset("phi-3-mini"), "resid_pdrop": 0.1}}
    model = build_meta_model(load_model_config(model_input), attention="sdpa")
    facts = model_facts(model_input)
    shape = {"seq_len": 512, "micro_batch_size": 2, "attention": "sdpa"}
    run = prepare(facts, parse_workload(shape))
    without = prepare(model_facts({"preset": "phi-3-mini"}), parse_workload(shape))
    for tier in TIERS:
        measured = measure_activation_bytes(model, tier, **shape)
        assert activation_bytes(facts.arch, run.step, tier) == measured, tier
    assert activation_bytes(facts.arch, run.step, "selective") > activation_bytes(
        without.facts.arch, without.step, "selective"
    )


@pytest.mark.parametrize(
    "workload",
    [
        {"attention": "eager", "micro_batch_size": 2},
        {"attention": "flash_attention_2"},
        {"dtype": "fp32", "micro_batch_size": 2},
    ],
)
@pytest.mark.parametrize("preset", ["gemma-2-9b", "phi-3-mini", "t5-base"])
def test_estimate_matches_other_attention_dtype_batch(preset: str, workload: dict) -> None:
    assert_estimate_matches(preset, seq_len=2048, **workload)


@pytest.mark.parametrize("attention", ["sdpa", "eager", "flash_attention_2"])
@pytest.mark.parametrize(
    "preset",
    [*REPRESENTATIVE, "gpt2", "bert-base-uncased", "gemma-2-9b"],
)
def test_estimate_matches_meta_measurement_of_a_padded_batch(preset: str, attention: str) -> None:
    """A padded batch: sdpa gets a boolean mask per sample on every layer, keeps a float
    copy of it per layer and repeats grouped K / V heads; BERT gets a mask at all; T5's
    encoder and cross-attention fold their bias into it per sample.  Falcon's sdpa always
    gets one and Gemma 2 runs eager, so padding changes nothing they keep.  Flash unpads
    q, k and v for its varlen kernel and pads its output back (`bench/flash_padding.py`
    measures that path; the meta stand-in follows it)."""
    if attention == "flash_attention_2" and preset == "falcon-7b":
        pytest.skip("Falcon's flash attention is a module of its own, which meta runs as sdpa")
    workload = {"seq_len": 512, "micro_batch_size": 2, "attention": attention}
    assert_estimate_matches(preset, padded=True, **workload)
    if attention == "sdpa" and preset not in ("falcon-7b", "gemma-2-9b"):
        padded = run_for(preset, padded=True, **workload)
        unpadded = run_for(preset, **workload)
        for tier in ("off", "medium"):
            more = activation_bytes(padded.facts.arch, padded.step, tier)
            assert more > activation_bytes(unpadded.facts.arch, unpadded.step, tier), tier


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("targets", [None, ["q_proj", "v_proj"]])
@pytest.mark.parametrize("preset", ["llama-3.2-1b", "gemma-3-1b"])
def test_lora_matches_peft_on_meta(preset: str, targets: list[str] | None, attention: str) -> None:
    """PEFT's LoRA on the meta model, trained as PEFT trains with checkpointing
    (``enable_input_require_grads``): the same trainable parameters, and activations to
    the byte.  Eager attention's output is o_proj's input, kept only when o_proj is
    trained (its adapter keeps an fp32 copy of its own)."""
    assert_lora_matches_peft({"preset": preset}, targets, attention)


def assert_lora_matches_peft(
    model_input: dict[str, Any], targets: list[str] | None, attention: str
) -> None:
    """PEFT's LoRA (rank 16, ``targets`` or all-linear) on the meta model, trained with
    ``enable_input_require_grads``: the estimate's trainable parameters, and its
    activations to the byte on every tier."""
    from peft import LoraConfig, get_peft_model

    base = build_meta_model(load_model_config(model_input), attention=attention)
    lora = LoraConfig(r=16, target_modules=targets or "all-linear", lora_dropout=0.0)
    peft_model = get_peft_model(base.to(torch.bfloat16), lora)
    peft_model.enable_input_require_grads()
    shape = {"seq_len": 512, "micro_batch_size": 2, "attention": attention}
    workload = {**shape, "method": "lora", "lora_rank": 16}
    if targets:
        workload["lora_targets"] = targets
    run = prepare(model_facts(model_input), parse_workload(workload))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert run.static.trainable_parameters == trainable
    for tier in TIERS:
        measured = measure_activation_bytes(peft_model, tier, **shape)
        assert activation_bytes(run.facts.arch, run.step, tier) == measured, tier


@pytest.mark.parametrize(
    ("model_input", "targets", "tower"),
    [
        ({"preset": "gemma-3-4b"}, ATTENTION_TARGETS, True),
        ({"config": MISTRAL3}, ATTENTION_TARGETS, True),
        ({"preset": "gemma-3-4b"}, "all-linear", True),
        ({"config": MISTRAL3}, "all-linear", True),
        ({"preset": "bert-base-uncased"}, "all-linear", False),
        ({"preset": "bert-base-uncased"}, ["dense"], False),
    ],
    ids=[
        "gemma3",
        "mistral3",
        "gemma3-all-linear",
        "mistral3-all-linear",
        "bert-all-linear",
        "bert-dense",
    ],
)
def test_adapter_targets_reach_the_vision_tower_and_the_head(
    model_input: dict[str, Any], targets: list[str] | str, tower: bool
) -> None:
    """PEFT matches ``target_modules`` by suffix on every module, a vision tower's and a
    head's too, and ``all-linear`` takes every linear but the output embeddings: a
    tower's linears get adapters that text-only training never runs (the estimate loads
    them, fp32 weights, and trains only the text model's); BERT's MLM-head transform
    (``cls.predictions.transform.dense``) gets one that trains."""
    from peft import LoraConfig, get_peft_model

    base = build_meta_model(load_model_config(model_input), attention="sdpa")
    peft_model = get_peft_model(base.to(torch.bfloat16), LoraConfig(r=16, target_modules=targets))
    towers = ("vision_tower", "multi_modal_projector")
    adapters = {n: p.numel() for n, p in peft_model.named_parameters() if "lora_" in n}
    idle = sum(size for name, size in adapters.items() if any(t in name for t in towers))
    assert (idle > 0) == tower
    lora_targets = None if targets == "all-linear" else targets
    workload = {"seq_len": 512, "method": "lora", "lora_rank": 16, "lora_targets": lora_targets}
    run = prepare(model_facts(model_input), parse_workload(workload))
    assert run.static.trainable_parameters == sum(adapters.values()) - idle
    assert run.static.weights == sum(p.nbytes for p in peft_model.parameters())


# Model types no bundled preset has, by their configs.
CONFIGS = {
    "mt5": MT5_BASE,
    "mistral3": MISTRAL3,
    **{
        dict(overrides)["model_type"]: {**load_preset("llama-3.2-1b"), **dict(overrides)}
        for overrides in (
            GRANITE,
            SMOLLM3,
            OLMO3,
            MINISTRAL3,
            MINISTRAL,
            EXAONE4,
            GLM4,
            GLM,
            HUNYUAN,
            GEMMA,
            SEED_OSS,
            ERNIE4_5,
            STARCODER2,
            COHERE,
            COHERE2,
            STABLELM,
            PHI,
        )
    },
    "gpt_neox": {**load_preset("llama-3.2-1b"), **dict(GPT_NEOX)},
    "opt": {**load_preset("llama-3.2-1b"), **dict(OPT)},
}


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("name", CONFIGS)
def test_a_model_type_without_a_preset_is_estimated_as_measured(
    name: str, attention: str, padded: bool
) -> None:
    """mT5 runs T5's modules, so the T5 family's parameters and activations hold for it;
    Granite is Llama's block with scalar multipliers, which keep nothing for backward;
    SmolLM3's layers without RoPE keep q and k as projected, the same bytes; OLMo-3's
    sliding layers keep their mask and read rotary tables of their own; Mistral 3 is
    Mistral's text model behind a Pixtral tower and projector that text-only training
    never runs (their parameters counted, nothing kept), its LM head tied or not by the
    top-level config; Ministral 3 scales the rotated q, whose product replaces it and
    whose backward keeps the scale; Ministral's full-attention mask, made though every
    layer slides, is read by no layer, so nothing keeps it; EXAONE 4's global layers
    use no positions and keep q and k as normed, the same bytes; GLM-4's RoPE products
    keep its layer's own interleaved copies of half of cos and sin (GLM's, in Llama's
    layer, too); Hunyuan normalizes
    the rotated q and k, which keeps what normalizing them first keeps; Gemma (1) keeps
    its norms' fp32 work and its scaled embeddings, with heads wider than the model;
    Seed-OSS's residual dropout keeps a mask per branch (the attention's inside
    self_attn, recomputed under a selective checkpoint); ERNIE 4.5's RoPE products keep
    its layer's fp32 interleaved copies of cos and sin."""
    model_input = {"config": CONFIGS[name]}
    model = build_meta_model(load_model_config(model_input), attention=attention)
    facts = model_facts(model_input)
    assert facts.arch.model_type == name
    assert facts.layout.total == count_parameters(model)
    shape = {"seq_len": 1024, "micro_batch_size": 2, "attention": attention}
    run = prepare(facts, parse_workload({**shape, "padded": padded}))
    for tier in TIERS:
        measured = measure_activation_bytes(model, tier, padded=padded, **shape)
        estimated = activation_bytes(facts.arch, run.step, tier)
        assert estimated == measured, tier  # to the byte


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_t5_lora_equals_peft_on_meta(attention: str) -> None:
    """T5 LoRA, padded or not, equals PEFT's model on meta to the byte, trained as PEFT
    trains with checkpointing (``enable_input_require_grads``: the embeddings' dropout
    keeps its mask).  Padding adds (sdpa) a bias per sample in every encoder layer and
    cross-attention, (eager) two float masks for checkpointed blocks; the relative bias
    is frozen, so ``torch.where`` keeps no mask, nor its embedding the bucket indices,
    and eager's attention output is kept only by ``o``'s adapter, as its fp32 copy."""
    from peft import LoraConfig, get_peft_model

    config = load_model_config({"preset": "t5-base"})
    base = build_meta_model(config, attention=attention).to(torch.bfloat16)
    peft_model = get_peft_model(base, LoraConfig(r=16, target_modules="all-linear"))
    peft_model.enable_input_require_grads()
    shape = {"seq_len": 1024, "micro_batch_size": 4, "attention": attention}
    for padded in (False, True):
        run = run_for("t5-base", method="lora", padded=padded, **shape)
        for tier in TIERS:
            measured = measure_activation_bytes(peft_model, tier, padded=padded, **shape)
            assert activation_bytes(run.facts.arch, run.step, tier) == measured, (padded, tier)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("preset", ["llama-3.2-1b", "phi-3-mini"])
def test_flash_keeps_what_transformers_flash_path_keeps(
    preset: str, method: str, padded: bool
) -> None:
    """Flash attention, through transformers' own flash path (`bench/flash_padding.py`:
    stand-in kernels on CPU).  A padded batch is unpadded for the varlen kernel (gathered
    q, k, v, the output scattered back into o_proj's input); Phi-3's cat-ed RoPE leaves q
    contiguous per head, so the flash output is copied into o_proj's input.  Padded, the
    estimate counts every token as real: at most one token's share above."""
    from bench.flash_padding import estimated_bytes, measured_bytes, small_config

    config = small_config(preset)
    measured = measured_bytes(config, method, padded)
    estimated = estimated_bytes(config, method, padded)
    assert measured <= estimated <= measured * (1.001 if padded else 1.0)


@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("preset", ["llama-3.2-1b", "qwen3-8b", "phi-3-mini", "olmo-2-7b"])
def test_the_replayed_flash_block_keeps_the_closed_forms(preset: str, method: str) -> None:
    """The step replay's flash layer, padded or not, keeps the closed form's block bytes:
    no 4-D mask (flash reads the 2-D one), the unpadding's copies and indices."""
    from ckpt_core._memory.activations import block_bytes, block_kinds

    for padded in (False, True):
        run = run_for(
            preset,
            seq_len=1024,
            micro_batch_size=2,
            attention="flash_attention_2",
            method=method,
            padded=padded,
        )
        kind = block_kinds(run.facts.arch)[0][0]
        local, _ = block_bytes(run.facts.arch, run.step, "off", kind)
        assert replayed_block_bytes(run, selective=False) == local, padded


def test_llama2_7b_calibration_45_5_sbh_per_layer() -> None:
    """docs/design.md §4: Llama-2-7B, bf16, fused attention keeps ~45.5 x s x b x h B a layer."""
    arch = model_facts({"preset": "llama-2-7b"}).arch
    fewer = dataclasses.replace(
        arch,
        layers=arch.layers - 1,
        sliding_layers=arch.sliding_layers[:-1],
        moe_layers=arch.moe_layers[:-1],
    )
    step = Step(batch=2, seq=4096, dtype_bytes=2, attention="fused")
    per_layer = activation_bytes(arch, step, "off") - activation_bytes(fewer, step, "off")
    assert per_layer / (2 * 4096 * arch.hidden) == pytest.approx(45.5, abs=0.05)


@pytest.mark.parametrize(
    ("recipe", "kept_bytes", "nf4_bits"),
    [
        ({}, 4, 4.5),  # defaults: PEFT's kbit preparation (fp32), fp32 absmax per 64
        ({"kbit_preparation": "none", "double_quant": True}, 2, 4.127),  # 8-bit absmax
    ],
)
def test_weight_storage_orders_and_nf4_overhead(
    recipe: dict, kept_bytes: int, nf4_bits: float
) -> None:
    sizes = {
        weights: run_for(
            "llama-3.1-8b",
            seq_len=1024,
            method="qlora" if weights in ("int8", "nf4") else "lora",
            weights=weights,
            **recipe,
        ).static
        for weights in ("fp32", "bf16", "int8", "nf4")
    }
    adapters = sizes["bf16"].trainable_parameters * 4
    weights = {name: static.weights - adapters for name, static in sizes.items()}
    assert weights["fp32"] == 2 * weights["bf16"]
    assert weights["nf4"] < weights["int8"] < weights["bf16"]
    layout = model_facts({"preset": "llama-3.1-8b"}).layout
    quantized = sum(linear.weights for linear in layout.linears)
    kept = layout.total - quantized
    bits = (weights["nf4"] - kept_bytes * kept) * 8 / quantized
    assert bits == pytest.approx(nf4_bits, abs=0.001)


@pytest.mark.parametrize("tier", ["off", "full"])
def test_int8_weights_are_in_the_peak_as_bitsandbytes_holds_them(tier: str) -> None:
    """LLM.int8() keeps 1 B per weight and an fp32 scale per row (4-bit: half a byte and an
    absmax per 64): every allocated peak holds the difference.  The pool grows too, by
    less where the step's transients reuse blocks it had cached (the math backend's
    score-sized ones here: llama-3.2-1b's grouped heads in fp32 on a T4)."""
    plans = {
        weights: make_plan(
            tier,
            model={"preset": "llama-3.2-1b"},
            gpu="T4",
            workload={"seq_len": 1024, "method": "qlora", "weights": weights, "dtype": "fp16"},
        ).estimate
        for weights in ("nf4", "int8")
    }
    resident = {name: plan["assumptions"]["weights_bytes"] for name, plan in plans.items()}
    gap = resident["int8"] - resident["nf4"]
    assert gap > 0
    grown = {
        peak: plans["int8"]["tiers"][tier][peak] - plans["nf4"]["tiers"][tier][peak]
        for peak in ("allocated_bytes", "peak_bytes")
    }
    assert grown["allocated_bytes"] >= gap
    assert grown["peak_bytes"] > 0


def test_optimizer_states_by_optimizer_and_method() -> None:
    statics = {
        optimizer: run_for("llama-3.2-1b", seq_len=1024, optimizer=optimizer).static
        for optimizer in ("adamw", "adamw_8bit", "sgd")
    }
    params = statics["adamw"].trainable_parameters
    assert statics["adamw"].optimizer == 2 * statics["adamw"].gradients  # two states, param dtype
    assert (
        statics["adamw"].optimizer > statics["adamw_8bit"].optimizer > statics["sgd"].optimizer == 0
    )
    assert statics["adamw_8bit"].optimizer >= 2 * params
    lora = run_for("llama-3.2-1b", seq_len=1024, method="lora").static
    assert lora.gradients == 4 * lora.trainable_parameters  # fp32 adapters
    assert lora.trainable_parameters < params / 50


@pytest.mark.parametrize(
    ("workload", "field"),
    [
        ({"seq_len": 1024, "weights": "nf4"}, "workload.weights"),  # full FT of 4-bit weights
        ({"seq_len": 1024, "method": "lora", "lora_targets": ["wq"]}, "workload.lora_targets"),
        ({"seq_len": 0}, "workload.seq_len"),
    ],
)
def test_workloads_the_model_cannot_run_are_errors(workload: dict, field: str) -> None:
    with pytest.raises(InvalidWorkloadError) as raised:
        run_for("llama-3.2-1b", **workload)
    assert raised.value.field == field


@pytest.mark.parametrize("window", ["", "4096", [], {}, 0, -1, 1.5, True])
def test_a_sliding_window_that_is_not_a_positive_int_is_a_config_error(window: object) -> None:
    """Llama's config class takes any sliding_window: the estimate once crashed on it (a 500)."""
    config = {**load_preset("llama-3.2-1b"), "sliding_window": window}
    with pytest.raises(ModelConfigError) as raised:
        make_plan("auto", gpu="A100-80GB", model={"config": config}, workload={"seq_len": 64})
    assert raised.value.field == "model.config.sliding_window"


@pytest.mark.parametrize(
    ("part", "model_type", "field"),
    [
        ("text_config", "qwen2", "model.config.text_config"),
        ("vision_config", "siglip_vision_model", "model.config.vision_config"),
    ],
)
def test_a_mistral3_the_estimate_does_not_describe_is_a_config_error(
    part: str, model_type: str, field: str
) -> None:
    """Mistral 3 is described with a Mistral text model and a Pixtral tower only."""
    config = {**MISTRAL3, part: {**MISTRAL3[part], "model_type": model_type}}
    with pytest.raises(ModelConfigError) as raised:
        make_plan("auto", gpu="A100-80GB", model={"config": config}, workload={"seq_len": 64})
    assert raised.value.field == field


MLA_TARGETS = ["q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize(
    ("config", "attention", "targets"),
    [
        (GPT_OSS, "eager", None),
        (GPT_OSS, "flash_attention_2", None),
        (QWEN2_MOE, "sdpa", None),
        (QWEN2_MOE, "eager", None),
        (QWEN2_MOE_SPARSE, "sdpa", None),
        (OLMOE, "sdpa", ATTENTION_TARGETS),
        (OLMOE_CLIPPED, "eager", ATTENTION_TARGETS),
        (GLM4_MOE, "sdpa", ATTENTION_TARGETS),
        (GLM4_MOE_GROUPED, "eager", ATTENTION_TARGETS),
        (MOONLIGHT, "sdpa", MLA_TARGETS),
        (MOONLIGHT, "eager", MLA_TARGETS),
        (MOONLIGHT, "flash_attention_2", MLA_TARGETS),
        (DEEPSEEK_V3, "sdpa", ["q_a_proj", "q_b_proj", *MLA_TARGETS[1:]]),
        (DEEPSEEK_V2_LITE, "sdpa", MLA_TARGETS),
        (DEEPSEEK_V2_GROUPED, "eager", ["q_a_proj", "q_b_proj", *MLA_TARGETS[1:]]),
        (GLM4_MOE_LITE, "flash_attention_2", ["q_a_proj", "q_b_proj", *MLA_TARGETS[1:]]),
        (DOTS1, "sdpa", ATTENTION_TARGETS),
        (DOTS1_WINDOWED, "eager", ATTENTION_TARGETS),
    ],
    ids=[
        "gpt_oss-eager",
        "gpt_oss-flash",
        "qwen2_moe-sdpa",
        "qwen2_moe-eager",
        "qwen2_moe-sparse",
        "olmoe-sdpa",
        "olmoe-clipped",
        "glm4_moe-sdpa",
        "glm4_moe-grouped",
        "moonlight-sdpa",
        "moonlight-eager",
        "moonlight-flash",
        "deepseek_v3",
        "deepseek_v2-lite",
        "deepseek_v2-grouped",
        "glm4_moe_lite-flash",
        "dots1",
        "dots1-windowed",
    ],
)
def test_a_routed_experts_model_is_estimated_as_measured(
    config: dict[str, Any], attention: str, targets: list[str] | None, padded: bool
) -> None:
    """gpt-oss: eager attention with a sink column (its max's indices and a softmax in
    the dtype kept), chunked RoPE on half-width tables, a biased router's top-k softmax
    and grouped_mm experts with gathered biases and a clamped SwiGLU, whose products keep
    their factors; with flash, its RoPE's cat leaves q contiguous per head, so the
    kernel's output is copied into o_proj's input.  Qwen2-MoE: unnormalized top-k
    weights (no sum kept), and a shared expert on every token whose output and sigmoid
    gate the product keeps; its LoRA adapts the shared expert and its gate too
    (``all-linear``); with a sparse step, dense layers between.  OLMoE: q and k
    normalized over the whole projections; ``clip_qkv`` clamps q, k and v in place, each
    clamp keeping a copy.  GLM-4.5: an fp32 router (its weight fp32 in any load, so a
    half input is copied to fp32) scoring by a sigmoid it keeps, a shared expert added as
    it is, leading dense layers, RoPE on half of each head.  DeepSeek-V3 (Moonlight):
    GLM-4.5's experts behind multi-head latent attention (the latents' norms, v a slice
    of kv_b_proj's output, or for flash a copy padded to q's head dim); DeepSeek-V2's
    softmax router (its group-limited choice keeps a mask) and complex RoPE table.
    dots.llm1: Qwen3's attention with DeepSeek-V3's experts.  Full fine-tune
    and PEFT's LoRA (trained as with checkpointing; ``all-linear`` unless targets are
    given), to the byte; the parameter count equals the built model's, and the weights'
    bytes as loaded in bf16 PEFT's model's."""
    from peft import LoraConfig, get_peft_model

    model_input = {"config": config}
    model = build_meta_model(load_model_config(model_input), attention=attention)
    facts = model_facts(model_input)
    assert facts.layout.total == count_parameters(model)
    shape = {"seq_len": 1024, "micro_batch_size": 2, "attention": attention}
    full = prepare(facts, parse_workload({**shape, "padded": padded}))
    for tier in TIERS:
        measured = measure_activation_bytes(model, tier, padded=padded, **shape)
        assert activation_bytes(facts.arch, full.step, tier) == measured, tier
    workload = {**shape, "padded": padded, "method": "lora", "lora_targets": targets}
    lora = prepare(facts, parse_workload(workload))
    lora_config = LoraConfig(r=16, target_modules=targets or "all-linear", lora_dropout=0.0)
    peft_model = get_peft_model(as_loaded(model, torch.bfloat16), lora_config)
    peft_model.enable_input_require_grads()
    assert lora.static.trainable_parameters == sum(
        p.numel() for p in peft_model.parameters() if p.requires_grad
    )
    assert lora.static.weights == sum(p.nbytes for p in peft_model.parameters())
    for tier in TIERS:
        measured = measure_activation_bytes(peft_model, tier, padded=padded, **shape)
        assert activation_bytes(facts.arch, lora.step, tier) == measured, tier


def test_frozen_experts_not_in_bf16_keep_no_grouped_matmul_input() -> None:
    """Experts frozen in fp32 (QLoRA's, after kbit preparation) go through aten's grouped
    matmul fallback on the GPU, whose autograd keeps each input only for the other's
    gradient: with LoRA on the attention only, no grouped matmul keeps its rows.  The
    meta measurement's stand-in does the same (through transformers' fallback operator it
    measured 14% more here) and equals the estimate to the byte."""
    from peft import LoraConfig, get_peft_model

    model_input = {"config": QWEN2_MOE}
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    base = build_meta_model(load_model_config(model_input), attention="sdpa")
    peft_model = get_peft_model(base.float(), LoraConfig(r=16, target_modules=targets))
    peft_model.enable_input_require_grads()
    shape = {"seq_len": 512, "micro_batch_size": 2, "attention": "sdpa", "dtype": "fp32"}
    run = prepare(
        model_facts(model_input),
        parse_workload({**shape, "method": "lora", "lora_targets": targets}),
    )
    for tier in TIERS:
        measured = measure_activation_bytes(peft_model, tier, **shape)
        assert activation_bytes(run.facts.arch, run.step, tier) == measured, tier


def test_gpt_oss_asked_for_sdpa_runs_eager() -> None:
    """Its model class has no sdpa: transformers runs eager, and so does the estimate."""
    workload = parse_workload({"seq_len": 512, "attention": "sdpa"})
    assert prepare(model_facts({"config": GPT_OSS}), workload).step.attention == "eager"


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_partial_rotary_factor_shrinks_the_kept_tables(attention: str) -> None:
    """Phi-4-mini rotates 3/4 of each head: its cos / sin tables are that wide (they were
    counted a whole head wide, 96 KiB too many at this shape)."""
    model_input = {"config": {**load_preset("phi-3-mini"), "partial_rotary_factor": 0.75}}
    model = build_meta_model(load_model_config(model_input), attention=attention)
    facts = model_facts(model_input)
    assert facts.arch.rope_dim == 72
    shape = {"seq_len": 1024, "micro_batch_size": 2, "attention": attention}
    run = prepare(facts, parse_workload(shape))
    for tier in ("off", "full"):
        measured = measure_activation_bytes(model, tier, **shape)
        assert activation_bytes(facts.arch, run.step, tier) == measured, tier


@pytest.mark.parametrize("factor", [0, 1.5, "half", True])
def test_a_partial_rotary_factor_outside_0_1_is_a_config_error(factor: object) -> None:
    config = {**load_preset("llama-3.2-1b"), **dict(GLM4), "partial_rotary_factor": factor}
    with pytest.raises(ModelConfigError) as raised:
        make_plan("auto", gpu="A100-80GB", model={"config": config}, workload={"seq_len": 64})
    assert "partial_rotary_factor" in (raised.value.field or "")


@pytest.mark.parametrize("overrides", [MINISTRAL, HUNYUAN], ids=["ministral", "hunyuan"])
def test_a_config_without_the_head_dim_its_attention_reads_is_a_config_error(
    overrides: tuple[tuple[str, Any], ...],
) -> None:
    """Ministral's and Hunyuan's attention read ``config.head_dim`` as it is, with no
    fallback: such a config does not build, so the estimate names the field rather
    than guess."""
    config = {**load_preset("llama-3.2-1b"), **dict(overrides)}
    del config["head_dim"]
    with pytest.raises(ModelConfigError) as raised:
        make_plan("auto", gpu="A100-80GB", model={"config": config}, workload={"seq_len": 64})
    assert raised.value.field == "model.config.head_dim"


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize(
    ("variant", "base"),
    [(STABLELM_PARALLEL, STABLELM), (GPT_NEOX_SEQUENTIAL, GPT_NEOX)],
    ids=["stablelm-parallel", "gpt_neox-sequential"],
)
def test_a_residual_layout_variant_is_estimated_as_measured(
    variant: tuple[tuple[str, Any], ...], base: tuple[tuple[str, Any], ...], attention: str
) -> None:
    """``use_parallel_residual``: StableLM's parallel residual (one LayerNorm read by the
    attention and the MLP), GPT-NeoX's sequential one (its MLP's norm reads the input plus
    the attention's output); the parameter count and the kept bytes to the byte."""
    model_input = {"config": {**load_preset("llama-3.2-1b"), **dict(variant)}}
    model = build_meta_model(load_model_config(model_input), attention=attention)
    facts = model_facts(model_input)
    base_input = {"config": {**load_preset("llama-3.2-1b"), **dict(base)}}
    assert facts.arch != model_facts(base_input).arch
    assert facts.layout.total == count_parameters(model)
    shape = {"seq_len": 1024, "micro_batch_size": 2, "attention": attention}
    run = prepare(facts, parse_workload(shape))
    for tier in TIERS:
        measured = measure_activation_bytes(model, tier, **shape)
        assert activation_bytes(facts.arch, run.step, tier) == measured, tier


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize(
    ("overrides", "targets"),
    [
        (PHI, None),
        (PHI, ["q_proj", "k_proj", "v_proj", "dense"]),
        (GPT_NEOX, None),
        (GPT_NEOX, ["query_key_value", "dense"]),
        (OPT, None),
        (OPT, ["q_proj", "k_proj", "v_proj", "out_proj"]),
    ],
    ids=["phi-all", "phi-attention", "gpt_neox-all", "gpt_neox-attention", "opt-all", "opt-attn"],
)
def test_lora_on_linears_named_otherwise_matches_peft_on_meta(
    overrides: tuple[tuple[str, Any], ...], targets: list[str] | None, attention: str
) -> None:
    """Linears by their models' own names (Phi's ``dense``, ``fc1`` / ``fc2``; GPT-NeoX's
    ``query_key_value``, ``dense``, ``dense_h_to_4h`` / ``dense_4h_to_h``; OPT's
    ``out_proj``, ``fc1`` / ``fc2``, outside an ``mlp`` module): PEFT's
    adapters on them, trained with residual and embedding dropout as PEFT trains with
    checkpointing, have the estimate's trainable parameters and keep its activations to
    the byte."""
    model_input = {"config": {**load_preset("llama-3.2-1b"), **dict(overrides)}}
    assert_lora_matches_peft(model_input, targets, attention)


@pytest.mark.parametrize(
    ("overrides", "field", "value"),
    [
        (STABLELM, "qk_layernorm", True),
        (STABLELM, "hidden_dropout", 0.1),
        (PHI, "qk_layernorm", True),
        (OPT, "do_layer_norm_before", False),
        (OPT, "word_embed_proj_dim", 512),
        (OPT, "layer_norm_elementwise_affine", False),
        (OPT, "_remove_final_layer_norm", True),
    ],
    ids=[
        "stablelm-qk_layernorm",
        "stablelm-hidden_dropout",
        "phi-qk_layernorm",
        "opt-post_layer_norm",
        "opt-projected_embeddings",
        "opt-no_affine",
        "opt-no_final_norm",
    ],
)
def test_undescribed_layer_options_are_config_errors(
    overrides: tuple[tuple[str, Any], ...], field: str, value: object
) -> None:
    """StableLM's and Phi's per-head q / k LayerNorms, StableLM's MLP-only dropout, and
    OPT's other layouts: OPT-350m's post-LayerNorms and narrower embeddings, LayerNorms
    without weights, no final LayerNorm."""
    config = {**load_preset("llama-3.2-1b"), **dict(overrides), field: value}
    with pytest.raises(ModelConfigError) as raised:
        make_plan("auto", gpu="A100-80GB", model={"config": config}, workload={"seq_len": 64})
    assert raised.value.field == f"model.config.{field}"


def test_gpt2_with_cross_attention_is_a_config_error() -> None:
    """GPT-2 as an encoder-decoder's decoder (``add_cross_attention``) has cross-attention
    layers the estimate does not describe: an error naming the field, not an estimate
    that leaves them out."""
    config = {**load_preset("gpt2"), "add_cross_attention": True}
    with pytest.raises(ModelConfigError) as raised:
        make_plan("auto", gpu="A100-80GB", model={"config": config}, workload={"seq_len": 64})
    assert raised.value.field == "model.config.add_cross_attention"


def test_a_valid_sliding_window_is_estimated() -> None:
    config = {**load_preset("llama-3.2-1b"), "sliding_window": 32}
    plan = make_plan("auto", gpu="A100-80GB", model={"config": config}, workload={"seq_len": 64})
    assert plan.estimate is not None


@pytest.mark.parametrize(
    ("arch", "dropout"),
    [
        ("llama", 0.0),
        ("granite", 0.0),
        ("smollm3", 0.0),
        ("olmo3", 0.0),
        ("ministral3", 0.0),
        ("ministral", 0.0),
        ("exaone4", 0.0),
        ("glm4", 0.0),
        ("glm", 0.0),
        ("starcoder2", 0.0),
        ("cohere", 0.0),
        ("cohere2", 0.0),
        ("stablelm", 0.0),
        ("phi", 0.0),
        ("phi", 0.1),
        ("gpt_neox", 0.0),
        ("gpt_neox", 0.1),
        ("opt", 0.0),
        ("opt", 0.1),
        ("hunyuan_v1_dense", 0.0),
        ("gemma", 0.0),
        ("deepseek_v3", 0.0),
        ("deepseek_v2", 0.0),
        ("seed_oss", 0.1),
        ("ernie4_5", 0.0),
        ("phi3", 0.1),
        ("gemma2", 0.0),
        ("gpt2", 0.1),
        ("bert", 0.1),
        ("t5", 0.0),
        ("t5", 0.1),
        ("falcon", 0.0),
    ],
)
def test_recompute_flops_ratio_matches_flop_counter(arch: str, dropout: float) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    from ckpt_core import install_checkpoint_hooks, remove_checkpoint_hooks

    model = tiny_model(arch, attn_implementation="eager", dropout=dropout)
    ids = torch.randint(3, 90, (2, 32), generator=torch.Generator().manual_seed(0))
    kwargs = {} if arch == "bert" else {"use_cache": False}

    def flops(tier: str) -> int:
        if tier != "off":
            install_checkpoint_hooks(model, tier)
        with FlopCounterMode(display=False) as counter:
            model(input_ids=ids, labels=ids, **kwargs).loss.backward()
        remove_checkpoint_hooks(model)
        model.zero_grad(set_to_none=True)
        return counter.get_total_flops()

    base = flops("off")
    step = Step(batch=2, seq=32, dtype_bytes=4, attention="eager")
    for tier in ("selective", "medium", "full"):
        expected = recompute_ratio(arch_of(model.config), step, tier)
        assert expected == pytest.approx(flops(tier) / base, rel=0.02), tier


@pytest.mark.parametrize(
    ("preset", "layers", "tier", "seq"),
    [
        ("llama-3.2-1b", 16, "off", 1024),
        ("llama-2-7b", 8, "full", 1024),
        ("llama-2-7b", 4, "medium", 2048),
    ],
)
def test_peak_without_allowance_matches_mem_tracker_on_meta(
    preset: str, layers: int, tier: str, seq: int
) -> None:
    """weights + gradients + activations + transient vs MemTracker's peak of a training step.

    Eager attention (its recompute needs no meta stand-in), SGD without
    momentum, gradients already allocated (a second micro-batch).  The 1B
    model peaks in the loss backward (128k vocabulary), the 7B-shaped one (8
    layers, to stay quick) in a block's backward; the model may err a little
    high, never much low.  Under medium on an even count the last block is not
    checkpointed, so its kept storages are freed before any block is recomputed
    (the 4-layer case was 20% high when the recompute was added to all of them).
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    from ckpt_core import install_checkpoint_hooks
    from ckpt_core._configs.presets import load_preset
    from ckpt_core._memory.peak_model import tier_memory
    from ckpt_core._meta.stand_ins import meta_kernels, no_data_dependent_mask_checks

    model_input = {"config": {**load_preset(preset), "num_hidden_layers": layers}}
    model = build_meta_model(load_model_config(model_input), attention="eager")
    model = model.to(torch.bfloat16).train()
    if tier != "off":
        install_checkpoint_hooks(model, tier)
    ids = torch.zeros(1, seq, dtype=torch.long, device="meta")
    tracker = MemTracker()
    tracker.track_external(model)
    with no_data_dependent_mask_checks(), meta_kernels(flash=False):
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()  # gradients exist
        with tracker:
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    peak = tracker.get_tracker_snapshot("peak")
    (device,) = (key for key in peak if key.type == "meta")
    measured = next(value for key, value in peak[device].items() if str(key).endswith("Total"))
    workload = {"seq_len": seq, "optimizer": "sgd", "attention": "eager"}
    run = prepare(model_facts(model_input), parse_workload(workload))
    memory = tier_memory(run.facts.arch, run.step, tier, run.static)
    estimated = run.static.total + memory.activation_bytes + memory.transient_bytes
    assert measured * 0.99 <= estimated <= measured * 1.05


def replayed_block_bytes(run: Run, *, selective: bool) -> int:
    """What the step replay's first decoder layer (off or selective), as its family's
    `TraceModel` runs it, keeps at the end of its forward."""
    from ckpt_core._memory.autograd_sim import Sim
    from ckpt_core._memory.families import family_of

    arch, recipe = run.facts.arch, run.recipe.trace
    model = family_of(arch).trace(arch)
    sim = Sim()
    inputs = model.prepare(sim, arch, recipe, 0)
    shared = set(sim.tensors) - {inputs.hidden}  # masks, rotary tables: made once per step
    layer = functools.partial(model.block, arch=arch, recipe=recipe, inputs=inputs, index=0)
    out = layer(sim, inputs.hidden, selective=selective)
    sim.drop(inputs.hidden)
    # Tensor bytes, as the meta measurement counts them (not the allocator's block sizes).
    return sim.storage_bytes(tid for tid in sim.tensors if tid not in shared and tid != out)


def replayed_recompute_inputs(run: Run) -> int:
    """What a checkpointed step keeps once for the recomputes besides the layers' inputs
    (Gemma 3's boolean sliding mask; `Inputs.forward_held`)."""
    from ckpt_core._memory.autograd_sim import Sim
    from ckpt_core._memory.families import family_of

    arch, recipe = run.facts.arch, run.recipe.trace
    sim = Sim()
    inputs = family_of(arch).trace(arch).prepare(sim, arch, recipe, 0)
    return sum(sim.size(tid) for tid in inputs.forward_held)


@pytest.mark.parametrize(
    ("preset", "targets", "seq"),
    [
        ("llama-3.2-1b", ["q_proj", "k_proj", "v_proj", "o_proj"], 512),
        ("qwen2.5-1.5b", ["q_proj", "k_proj", "v_proj", "o_proj"], 512),
        ("gemma-3-1b", ["q_proj", "k_proj", "v_proj", "o_proj"], 512),
        ("qwen3-8b", ["q_proj", "k_proj", "v_proj", "o_proj"], 512),
        ("phi-3-mini", ["qkv_proj", "o_proj", "gate_up_proj"], 512),
        ("phi-3-mini", ["qkv_proj", "o_proj"], 512),
        ("phi-3-mini", ["qkv_proj", "o_proj"], 2048),  # its window (2047) masks
        ("gemma-2-9b", ["q_proj", "k_proj", "v_proj", "o_proj"], 512),
        ("olmo-2-7b", ["q_proj", "k_proj", "v_proj", "o_proj"], 512),
    ],
)
def test_replayed_selective_block_keeps_what_peft_keeps_on_meta(
    preset: str, targets: list[str], seq: int
) -> None:
    """Llama-style decoders take their allocated peak from the step replay: what selective
    saves over off, per block, is what it saves on PEFT's LoRA model on meta (the block
    keeps input_layernorm's fp32 upcast: the norm runs outside the hooked self_attn).
    Gemma 3's layer is replayed as its own: its sandwich and q / k norms' fp32 upcasts
    and a sliding layer's additive sdpa mask (seq 512 = its window) are kept off only;
    the boolean mask it is made from, by selective's checkpoints only.  Qwen3's q / k
    norms keep their fp32 upcasts; Phi-3's q, k, v and gate, up are views of one
    projection each, whose whole output a view keeps; once its sliding window masks,
    sdpa's additive copy of the boolean mask is kept per block, off only.  Gemma 2's
    eager scores keep softcapping's tanh; OLMo-2 has no norm before its attention,
    and its full-width q / k norms and fp32 RoPE products are kept off only."""
    from peft import LoraConfig, get_peft_model

    layers = 2
    model_input = {"config": {**load_preset(preset), "num_hidden_layers": layers}}
    base = build_meta_model(load_model_config(model_input), attention="sdpa").to(torch.bfloat16)
    lora = LoraConfig(r=32, lora_alpha=64, target_modules=targets, lora_dropout=0.0)
    peft_model = get_peft_model(base, lora)
    measured = [
        measure_activation_bytes(peft_model, tier, seq_len=seq, micro_batch_size=1)
        for tier in ("off", "selective")
    ]
    workload = {"seq_len": seq, "method": "lora", "lora_rank": 32, "lora_targets": targets}
    run = prepare(model_facts(model_input), parse_workload(workload))
    saved = replayed_block_bytes(run, selective=False) - replayed_block_bytes(run, selective=True)
    # Selective's checkpoints also keep the step's sliding mask (measured once).
    held = replayed_recompute_inputs(run)
    assert layers * saved - held == pytest.approx(measured[0] - measured[1], rel=0.001)
