"""Dry run on meta: per-tier reports on dense, MoE, encoder-decoder and VLM presets; errors."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from ckpt_core import (
    ConfigTooLargeError,
    InvalidTierError,
    InvalidWorkloadError,
    ModelConfigError,
    UnknownPresetError,
)
from ckpt_core._configs.config_json import ConfigLimits
from ckpt_core._configs.model_config import build_meta_model, count_parameters, load_model_config
from ckpt_core._configs.presets import list_presets, load_preset
from ckpt_core._dry_run import DryRunReport, dry_run
from ckpt_core._memory.activations import activation_bytes
from ckpt_core._memory.inputs import model_facts, parse_workload, prepare

# A dense decoder, an MoE, an encoder-decoder and a vision + language model.
PRESETS = ("llama-3.2-1b", "qwen3-30b-a3b", "t5-base", "gemma-3-4b")
ATTENTION_NAMES = ("self_attn", "layer.0", "layer.1", "attention")


def expected_blocks(config: dict[str, Any]) -> int:
    """Transformer blocks a config declares: every stack, text and vision."""
    if "text_config" in config:
        return sum(expected_blocks(config[key]) for key in ("text_config", "vision_config"))
    if config.get("is_encoder_decoder"):
        return config["num_layers"] + config.get("num_decoder_layers", config["num_layers"])
    return config["num_hidden_layers"]


@functools.cache
def report(preset: str, tier: str, **kwargs: Any) -> DryRunReport:
    return dry_run({"preset": preset}, tier, **kwargs)


@pytest.mark.parametrize("preset", PRESETS)
def test_off_hooks_nothing_but_counts_the_blocks(preset: str) -> None:
    off = report(preset, "off")
    assert (off.granularity, off.hooked, off.modules, off.native) == (None, 0, (), False)
    assert off.blocks == expected_blocks(load_preset(preset))


@pytest.mark.parametrize("preset", PRESETS)
def test_full_covers_every_block_natively(preset: str) -> None:
    full = report(preset, "full")
    assert full.granularity == "full"
    assert full.blocks == full.hooked == len(full.modules) == expected_blocks(load_preset(preset))
    assert len(set(full.modules)) == full.hooked
    assert full.native  # the installed transformers checkpoints every block itself
    assert not any("experts" in name for name in full.modules)


@pytest.mark.parametrize("preset", PRESETS)
def test_medium_covers_every_other_block(preset: str) -> None:
    full, medium = report(preset, "full"), report(preset, "medium")
    assert medium.granularity == "medium"
    # HF's every_n_layers=2 counts all stacks with one counter: blocks 0, 2, 4, ...
    assert medium.modules == full.modules[::2]
    assert medium.hooked == (full.blocks + 1) // 2
    assert medium.native


@pytest.mark.parametrize("preset", PRESETS)
def test_selective_covers_the_attention_of_every_block(preset: str) -> None:
    full, selective = report(preset, "full"), report(preset, "selective")
    assert selective.granularity == "selective"
    assert not selective.native  # HF off, the worker installs the hooks
    blocks = {name: block for name in selective.modules for block in full.modules
              if name.startswith(block + ".")}  # fmt: skip
    assert set(blocks) == set(selective.modules)  # every hooked module lies in a block
    assert set(blocks.values()) == set(full.modules)  # and every block has one
    for name in selective.modules:
        assert name.endswith(ATTENTION_NAMES), name
        assert not any(part in name for part in ("proj", "norm", "experts")), name


def test_encoder_decoder_selective_hooks_self_and_cross_attention() -> None:
    t5 = report("t5-base", "selective")
    decoder = [name for name in t5.modules if name.startswith("decoder.")]
    encoder = [name for name in t5.modules if name.startswith("encoder.")]
    config = load_preset("t5-base")
    assert len(encoder) == config["num_layers"]
    assert len(decoder) == 2 * config.get("num_decoder_layers", config["num_layers"])


def test_vlm_reports_both_stacks() -> None:
    full = report("gemma-3-4b", "full")
    config = load_preset("gemma-3-4b")
    vision = [name for name in full.modules if "vision_tower" in name]
    assert len(vision) == config["vision_config"]["num_hidden_layers"]
    assert full.hooked - len(vision) == config["text_config"]["num_hidden_layers"]


def test_medium_needs_hooks_on_transformers_without_every_n_layers() -> None:
    old = dry_run({"preset": "llama-3.2-1b"}, "medium", transformers_version="5.15.0")
    assert not old.native
    assert old.modules == report("llama-3.2-1b", "medium").modules


@pytest.mark.parametrize("preset", PRESETS)
def test_report_counts_the_built_model(preset: str) -> None:
    built = build_meta_model(load_model_config({"preset": preset}))
    full = report(preset, "full")
    assert full.parameters == count_parameters(built)
    assert full.architecture == type(built).__name__
    assert full.model_type == load_preset(preset)["model_type"]


@pytest.mark.parametrize(
    ("memory", "granularity"), [(16, "full"), (40, "medium"), (141, "selective")]
)
def test_auto_resolves_by_gpu_memory(memory: float, granularity: str) -> None:
    auto = dry_run({"preset": "llama-3.2-1b"}, "auto", memory)
    assert (auto.tier, auto.granularity) == ("auto", granularity)
    assert auto.modules == report("llama-3.2-1b", granularity).modules


def test_auto_resolves_by_gpu_name() -> None:
    assert dry_run({"preset": "gpt2"}, "auto", gpu="A100-80GB").granularity == "medium"


def test_a_70b_preset_dry_runs() -> None:
    info = next(info for info in list_presets() if info.name == "llama-3.1-70b")
    full = dry_run({"preset": info.name}, "full")
    assert full.hooked == full.blocks == load_preset(info.name)["num_hidden_layers"]
    assert abs(full.parameters - info.published_parameters) / info.published_parameters < 0.03


def test_inline_config_dry_runs() -> None:
    config = {**load_preset("llama-3.2-1b"), "num_hidden_layers": 3}
    full = dry_run({"config": config}, True)
    assert (full.tier, full.blocks, full.hooked) == ("full", 3, 3)


def test_report_is_json() -> None:
    data = report("t5-base", "selective").to_dict()
    assert json.loads(json.dumps(data)) == data
    assert isinstance(data["modules"], list)
    assert data["hooked"] == len(data["modules"])
    assert data["elapsed_ms"] > 0
    assert data["measured"] is None


# --- errors ------------------------------------------------------------------


GPT2 = {"model_type": "gpt2"}


@pytest.mark.parametrize(
    ("model", "error", "field"),
    [
        ({"preset": "gpt-5"}, UnknownPresetError, "model.preset"),
        ({"config": {"model_type": "gpt5"}}, ModelConfigError, "model.config.model_type"),
        ({"config": {**GPT2, "auto_map": {}}}, ModelConfigError, "model.config.auto_map"),
        ({"config": {**GPT2, "n_layer": 10_000}}, ConfigTooLargeError, "model.config.n_layer"),
        ({"model": "gpt2"}, ModelConfigError, "model"),
        # HF's own checkpointing would be on in the built model: bad input, not a conflict.
        (
            {"config": {**GPT2, "gradient_checkpointing": True}},
            ModelConfigError,
            "model.config.gradient_checkpointing",
        ),
    ],
)
def test_bad_models_raise_the_matching_error(model: dict, error: type, field: str) -> None:
    with pytest.raises(error) as caught:
        dry_run(model, "full")
    assert caught.value.field == field


def test_limits_apply() -> None:
    with pytest.raises(ConfigTooLargeError) as caught:
        dry_run({"preset": "llama-3.1-70b"}, "full", limits=ConfigLimits(max_parameters=10**10))
    assert caught.value.field == "model.preset"


def test_bad_tier_fails_before_the_model_is_loaded(monkeypatch) -> None:
    import ckpt_core._dry_run as module

    def no_load(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("model loaded for an invalid tier")

    monkeypatch.setattr(module, "load_model_config", no_load)
    with pytest.raises(InvalidTierError):
        dry_run({"preset": "gpt2"}, "fulll")


@pytest.mark.parametrize(
    ("measure", "field"),
    [
        ([128], "measure"),
        ({}, "measure.seq_len"),
        ({"seq_len": 0}, "measure.seq_len"),
        ({"seq_len": "128"}, "measure.seq_len"),
        ({"seq_len": 128, "micro_batch_size": 0}, "measure.micro_batch_size"),
        ({"seq_len": 128, "dtype": "int4"}, "measure.dtype"),
        ({"seq_len": 128, "attention": "flash"}, "measure.attention"),
        ({"seq_len": 128, "method": "lora"}, "measure.method"),
    ],
)
def test_bad_measure_names_the_field(measure: object, field: str) -> None:
    with pytest.raises(InvalidWorkloadError) as caught:
        dry_run({"preset": "gpt2"}, "full", measure=measure)
    assert caught.value.field == field


# --- measurement -------------------------------------------------------------


def test_measure_passes_the_shape_and_the_hooked_model(monkeypatch) -> None:
    import ckpt_core._meta.measure as measure_module

    seen: dict[str, Any] = {}

    def fake_measure(model: Any, granularity: str | None, **shape: Any) -> int:
        from ckpt_core._hooks.install import is_hooked

        seen.update(shape, granularity=granularity)
        seen["hooked"] = sum(is_hooked(module) for module in model.modules())
        seen["device"] = next(model.parameters()).device.type
        return 4242

    monkeypatch.setattr(measure_module, "measure_activation_bytes", fake_measure)
    shape = {"seq_len": 64, "micro_batch_size": 2, "attention": "eager", "padded": True}
    selective = dry_run({"preset": "llama-3.2-1b"}, "selective", measure=shape)
    assert selective.measured == {**shape, "dtype": "bf16", "activation_bytes": 4242}
    assert seen["granularity"] == "selective"
    assert seen["hooked"] == selective.hooked
    assert seen["device"] == "meta"
    assert (seen["seq_len"], seen["micro_batch_size"], seen["attention"]) == (64, 2, "eager")
    assert seen["padded"] is True


def test_measured_full_keeps_less_than_off() -> None:
    shape = {"seq_len": 64}
    off = dry_run({"preset": "llama-3.2-1b"}, "off", measure=shape).measured
    full = dry_run({"preset": "llama-3.2-1b"}, "full", measure=shape).measured
    assert off is not None and full is not None
    assert 0 < full["activation_bytes"] < off["activation_bytes"]
    assert (full["seq_len"], full["micro_batch_size"]) == (64, 1)


def test_a_gpu_without_flash_measures_grouped_heads_as_the_math_backend() -> None:
    """On a T4 sdpa has no kernel that takes llama-3.2-1b's grouped heads in bf16: the
    measurement runs the math backend (fp32 softmax kept per layer), as the estimate for
    that GPU counts it; on an L4 flash takes them.  Tiers by the name's own memory."""
    shape = {"seq_len": 512}
    kept = {
        gpu: dry_run({"preset": "llama-3.2-1b"}, "off", gpu=gpu, measure=shape).measured
        for gpu in ("T4", "L4")
    }
    assert kept["T4"] is not None and kept["L4"] is not None
    softmax = 4 * 32 * 512 * 512  # fp32, heads x seq x seq, per layer
    assert kept["T4"]["activation_bytes"] - kept["L4"]["activation_bytes"] >= 16 * softmax
    run = prepare(model_facts({"preset": "llama-3.2-1b"}), parse_workload(shape), "T4")
    assert activation_bytes(run.facts.arch, run.step, "off") == pytest.approx(
        kept["T4"]["activation_bytes"], abs=32 * run.facts.arch.layers
    )


def test_a_measurement_beyond_learned_positions_names_the_measure_field() -> None:
    with pytest.raises(InvalidWorkloadError) as caught:
        dry_run({"preset": "gpt2"}, "full", measure={"seq_len": 4096})
    assert caught.value.field == "measure.seq_len"


def _inline(arch: str, **overrides: Any) -> dict[str, Any]:
    """A tiny config of ``arch`` as the JSON a client sends."""
    from tests._tiny_models import tiny_config

    return json.loads(tiny_config(arch, **overrides).to_json_string())


def test_bart_measures_on_meta() -> None:
    """BART's decoder mask check read tensor values (Tensor.item() on meta): it failed."""
    config = _inline("bart")
    measured = {
        tier: dry_run({"config": config}, tier, measure={"seq_len": 32}).measured
        for tier in ("off", "selective", "medium", "full")
    }
    sizes = {tier: m["activation_bytes"] for tier, m in measured.items() if m is not None}
    assert 0 < sizes["full"] < sizes["medium"] < sizes["off"]
    assert 0 < sizes["selective"] < sizes["off"]


def test_t5_without_decoder_start_token_measures_like_with_it() -> None:
    """HF's label shift needs decoder_start_token_id; the measurement does not."""
    with_start = _inline("t5")
    without = {k: v for k, v in with_start.items() if k != "decoder_start_token_id"}
    assert with_start["decoder_start_token_id"] == 0
    sizes = [
        dry_run({"config": config}, "selective", measure={"seq_len": 32}).measured
        for config in (with_start, without)
    ]
    assert sizes[0] is not None and sizes[0]["activation_bytes"] > 0
    assert sizes[1] == sizes[0]


# Lengths at which some GPU size gets a block-level plan for a full fine-tune: up to 4096
# a block-level plan, charged full's replayed fragmentation (4.3 GiB at 4096), never
# beats the tiers.
@pytest.mark.parametrize("seq", [8192, 16384])
def test_auto_with_a_measurement_shape_chooses_as_make_plan(seq: int) -> None:
    from ckpt_core import make_plan

    model = {"preset": "llama-3.2-1b"}
    # A GPU size at which auto answers a block-level plan for this workload.
    gib = next(
        g / 2
        for g in range(8, 200)
        if make_plan("auto", g / 2, model=model, workload={"seq_len": seq}).granularity == "blocks"
    )
    report = dry_run(model, "auto", gib, measure={"seq_len": seq})
    plan = make_plan("auto", gib, model=model, workload={"seq_len": seq})
    assert report.granularity == plan.granularity == "blocks"
    assert report.block_plan == plan.block_plan and report.reason == plan.reason
    assert report.native == (plan.hooks is None)
    planned = {f"model.layers.{i}" for i in plan.block_plan["full"]}
    planned |= {f"model.layers.{i}.self_attn" for i in plan.block_plan["selective"]}
    assert set(report.modules) == planned
    estimated = plan.estimate["chosen"]["activation_bytes"]
    assert report.measured["activation_bytes"] == pytest.approx(estimated, rel=0.02)
    assert report.to_dict()["block_plan"] == plan.block_plan


def test_auto_without_a_measurement_shape_says_it_used_the_thresholds() -> None:
    report = dry_run({"preset": "llama-3.2-1b"}, "auto", 40)
    assert report.granularity == "medium"
    assert "VRAM thresholds" in report.reason and "no model" in report.reason
    assert "block_plan" not in report.to_dict()
    assert "reason" not in dry_run({"preset": "llama-3.2-1b"}, "full").to_dict()


def test_auto_with_a_shape_on_a_model_the_estimate_does_not_describe_uses_the_thresholds() -> None:
    from ckpt_core import ESTIMATE_FAMILIES, ModelConfigError, make_plan

    # BLOOM (ALiBi): a model type transformers builds and the estimate does not describe.
    config = {
        "model_type": "bloom",
        "vocab_size": 256,
        "hidden_size": 32,
        "n_layer": 2,
        "n_head": 4,
    }
    assert config["model_type"] not in ESTIMATE_FAMILIES
    with pytest.raises(ModelConfigError, match="no memory model"):
        make_plan("auto", 40, model={"config": config}, workload={"seq_len": 16})
    report = dry_run({"config": config}, "auto", 40, measure={"seq_len": 16})
    assert report.granularity == make_plan("auto", 40).granularity == "medium"
    assert "VRAM thresholds" in report.reason
    assert "no memory model for model_type 'bloom'" in report.reason
    assert report.measured is not None and report.measured["activation_bytes"] > 0


def test_auto_with_a_padded_encoder_decoder_shape_chooses_as_make_plan() -> None:
    """T5 with a padded batch: the estimate describes it, so auto chooses by the model,
    and the measurement of that plan is the estimate's."""
    from ckpt_core import make_plan

    model = {"preset": "t5-base"}
    shape = {"seq_len": 512, "micro_batch_size": 4, "padded": True}
    plan = make_plan("auto", 16, model=model, workload=shape)
    report = dry_run(model, "auto", 16, measure=shape)
    assert report.granularity == plan.granularity and report.reason == plan.reason
    assert "VRAM thresholds" not in report.reason
    assert report.measured is not None and report.measured["padded"] is True
    estimated = plan.estimate["chosen"]["activation_bytes"]
    assert report.measured["activation_bytes"] == pytest.approx(estimated, rel=0.02)
