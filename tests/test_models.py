"""Model configs: validation paths with field names, bounds before building, offline meta build."""

from __future__ import annotations

import hashlib
import json
import math
import socket
import subprocess
import sys
from typing import Any

import pytest

from ckpt_core import ConfigTooLargeError, ModelConfigError, UnknownPresetError
from ckpt_core._configs.config_json import ConfigLimits, model_config_key
from ckpt_core._configs.model_config import (
    ModelConfig,
    build_meta_model,
    count_parameters,
    load_model_config,
)
from ckpt_core._configs.presets import load_preset

TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 256,
}

# DeepSeek-V3's published shape (671B): the default limits must admit it.
DEEPSEEK_V3: dict[str, Any] = {
    "model_type": "deepseek_v3",
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 129280,
}


def config_error(config: object, **kwargs: Any) -> ModelConfigError:
    with pytest.raises(ModelConfigError) as caught:
        load_model_config({"config": config}, **kwargs)
    return caught.value


# --- the model object --------------------------------------------------------


@pytest.mark.parametrize(
    "model",
    [None, "llama", [], {}, {"preset": "gpt2", "config": TINY_LLAMA}, {"name": "gpt2"}],
)
def test_model_must_be_exactly_one_of_preset_or_config(model: object) -> None:
    with pytest.raises(ModelConfigError) as caught:
        load_model_config(model)
    assert caught.value.field == "model"


def test_unknown_preset_is_an_unknown_preset_error() -> None:
    with pytest.raises(UnknownPresetError) as caught:
        load_model_config({"preset": "llama-9"})
    assert caught.value.field == "model.preset"


def test_preset_and_identical_inline_config_share_a_key() -> None:
    from_preset = load_model_config({"preset": "qwen2.5-0.5b"})
    inline = load_model_config({"config": load_preset("qwen2.5-0.5b")})
    assert (from_preset.source, from_preset.preset) == ("preset", "qwen2.5-0.5b")
    assert (inline.source, inline.preset) == ("config", None)
    assert from_preset.key == inline.key
    assert from_preset.config == inline.config


def test_key_is_sha256_of_sorted_compact_json_and_ignores_key_order() -> None:
    cfg = load_model_config({"config": TINY_LLAMA})
    text = json.dumps(TINY_LLAMA, sort_keys=True, separators=(",", ":"))
    assert cfg.key == hashlib.sha256(text.encode()).hexdigest()
    reordered = dict(reversed(list(TINY_LLAMA.items())))
    assert load_model_config({"config": reordered}).key == cfg.key
    changed = load_model_config({"config": {**TINY_LLAMA, "num_hidden_layers": 3}})
    assert changed.key != cfg.key


def test_model_config_is_a_private_copy_and_summarises_to_json() -> None:
    source = json.loads(json.dumps(TINY_LLAMA))
    cfg = load_model_config({"config": source})
    source["hidden_size"] = 8
    assert cfg.config["hidden_size"] == 64
    assert isinstance(cfg, ModelConfig)
    summary = cfg.to_dict()
    assert summary["architecture"] == "LlamaForCausalLM"
    assert summary["model_type"] == "llama"
    assert "config" not in summary
    json.dumps(summary)


# --- what the config may contain --------------------------------------------


def test_config_must_be_an_object() -> None:
    assert config_error(["llama"]).field == "model.config"


@pytest.mark.parametrize("model_type", [None, "", 3])
def test_model_type_is_required(model_type: object) -> None:
    config = {**TINY_LLAMA, "model_type": model_type}
    if model_type is None:
        del config["model_type"]
    assert config_error(config).field == "model.config.model_type"


def test_unknown_model_type_names_the_field() -> None:
    error = config_error({**TINY_LLAMA, "model_type": "llama-custom"})
    assert error.field == "model.config.model_type"
    assert "llama-custom" in str(error)


def test_unknown_nested_model_type_names_the_nested_field() -> None:
    config = load_preset("gemma-3-4b")
    config["vision_config"]["model_type"] = "my_vit"
    assert config_error(config).field == "model.config.vision_config.model_type"


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"auto_map": {"AutoConfig": "x.Config"}}, "model.config.auto_map"),
        ({"trust_remote_code": True}, "model.config.trust_remote_code"),
        ({"text_config": {"auto_map": {}}}, "model.config.text_config.auto_map"),
    ],
)
def test_remote_code_markers_are_refused(extra: dict[str, Any], field: str) -> None:
    error = config_error({**TINY_LLAMA, **extra})
    assert type(error) is ModelConfigError
    assert error.field == field
    assert "remote code" in str(error)


@pytest.mark.parametrize("value", [0, -1, "32", 32.0, True, [2, "x"]])
def test_size_fields_must_be_positive_ints(value: object) -> None:
    error = config_error({**TINY_LLAMA, "num_hidden_layers": value})
    assert type(error) is ModelConfigError
    assert error.field is not None and error.field.startswith("model.config.num_hidden_layers")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("num_hidden_layers", 513),
        ("hidden_size", 65_537),
        ("intermediate_size", 10**9),
        ("num_attention_heads", 10**6),
        ("vocab_size", 2**21),
        ("num_local_experts", 1025),
        ("max_position_embeddings", 2**30),
    ],
)
def test_size_fields_over_the_limits_are_too_large(key: str, value: int) -> None:
    error = config_error({**TINY_LLAMA, key: value})
    assert isinstance(error, ConfigTooLargeError)
    assert error.field == f"model.config.{key}"


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"model_type": "t5", "num_layers": 2, "num_decoder_layers": 600}, "num_decoder_layers"),
        ({"model_type": "bart", "encoder_layers": 1000}, "encoder_layers"),
        ({"model_type": "gpt2", "n_layer": 1000}, "n_layer"),
        ({"model_type": "gpt2", "n_embd": 10**6}, "n_embd"),
    ],
)
def test_family_specific_size_names_are_bounded(config: dict[str, Any], field: str) -> None:
    error = config_error(config)
    assert isinstance(error, ConfigTooLargeError)
    assert error.field == f"model.config.{field}"


def test_nested_sizes_are_bounded_with_their_path() -> None:
    config = load_preset("gemma-3-4b")
    config["text_config"]["num_hidden_layers"] = 10_000
    error = config_error(config)
    assert isinstance(error, ConfigTooLargeError)
    assert error.field == "model.config.text_config.num_hidden_layers"


def test_null_size_fields_mean_the_class_default() -> None:
    cfg = load_model_config({"config": {**TINY_LLAMA, "num_key_value_heads": None}})
    assert cfg.model_type == "llama"


def test_limits_are_configurable_and_a_preset_over_them_names_the_preset() -> None:
    with pytest.raises(ConfigTooLargeError) as caught:
        load_model_config({"preset": "llama-3.1-8b"}, limits=ConfigLimits(max_layers=16))
    assert caught.value.field == "model.preset"
    assert "llama-3.1-8b" in str(caught.value)


def test_parameter_bound_uses_the_analytic_estimate() -> None:
    with pytest.raises(ConfigTooLargeError) as caught:
        load_model_config({"preset": "llama-3.1-70b"}, limits=ConfigLimits(max_parameters=10**10))
    assert "parameters" in str(caught.value)
    load_model_config({"preset": "llama-3.1-8b"}, limits=ConfigLimits(max_parameters=10**10))


def test_default_limits_admit_a_671b_moe_and_its_estimate_is_close() -> None:
    cfg = load_model_config({"config": DEEPSEEK_V3})
    built = count_parameters(build_meta_model(cfg))
    assert 660e9 < built < 680e9
    assert abs(cfg.approx_parameters - built) / built < 0.10


def test_expert_instances_are_bounded() -> None:
    config = {**TINY_LLAMA, "model_type": "mixtral", "num_local_experts": 1024}
    config["num_hidden_layers"] = 512
    config.pop("architectures")
    error = config_error(config)
    assert isinstance(error, ConfigTooLargeError)
    assert "expert" in str(error)


def test_config_size_and_depth_are_bounded() -> None:
    big = config_error({**TINY_LLAMA, "notes": "x" * 300_000})
    assert isinstance(big, ConfigTooLargeError) and big.field == "model.config"
    many = config_error({**TINY_LLAMA, "ids": list(range(300_000))})
    assert isinstance(many, ConfigTooLargeError)
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(20):
        node["x"] = {}
        node = node["x"]
    assert isinstance(config_error({**TINY_LLAMA, "deep": deep}), ConfigTooLargeError)


def test_a_self_referencing_config_is_refused_not_a_hang() -> None:
    loop: dict[str, Any] = {}
    loop["again"] = loop
    assert isinstance(config_error({**TINY_LLAMA, "loop": loop}), ConfigTooLargeError)


@pytest.mark.parametrize("value", [math.nan, math.inf, {1, 2}, object(), b"bytes"])
def test_values_must_be_json(value: object) -> None:
    assert config_error({**TINY_LLAMA, "extra": value}).field == "model.config.extra"


def test_keys_must_be_strings() -> None:
    assert config_error({**TINY_LLAMA, 3: "x"}).field == "model.config"


def test_config_rejected_by_transformers_is_a_model_config_error() -> None:
    error = config_error({**TINY_LLAMA, "hidden_size": 100, "num_attention_heads": 3})
    assert error.field == "model.config"
    assert "transformers rejected" in str(error)


def test_bounds_are_checked_before_transformers_sees_the_config(monkeypatch) -> None:
    import transformers

    calls: list[str] = []

    def no_config(model_type: str, **kwargs: Any) -> None:
        calls.append(model_type)
        raise AssertionError("config built before the bounds were checked")

    monkeypatch.setattr(transformers.AutoConfig, "for_model", no_config)
    error = config_error({**TINY_LLAMA, "num_hidden_layers": 100_000})
    assert isinstance(error, ConfigTooLargeError)
    assert calls == []


def test_the_cheap_key_is_load_model_configs_key() -> None:
    for model in (
        {"preset": "qwen2.5-0.5b"},
        {"config": TINY_LLAMA},
        {"config": dict(reversed(list(TINY_LLAMA.items())))},
        {"config": DEEPSEEK_V3},
    ):
        assert model_config_key(model) == load_model_config(model).key


def test_the_cheap_key_never_builds_a_transformers_config(monkeypatch) -> None:
    import transformers

    def no_config(model_type: str, **kwargs: Any) -> None:
        raise AssertionError("model_config_key built a transformers config")

    monkeypatch.setattr(transformers.AutoConfig, "for_model", no_config)
    # transformers would reject this one (heads do not divide the width): only
    # load_model_config, which builds the config, finds out.
    rejected = {**TINY_LLAMA, "hidden_size": 100, "num_attention_heads": 3}
    text = json.dumps(rejected, sort_keys=True, separators=(",", ":"))
    assert model_config_key({"config": rejected}) == hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize(
    ("model", "error", "field"),
    [
        ({"preset": "gpt-7"}, UnknownPresetError, "model.preset"),
        ({"config": [1]}, ModelConfigError, "model.config"),
        ({"config": {**TINY_LLAMA, "model_type": "nope"}}, ModelConfigError, None),
        ({"config": {**TINY_LLAMA, "num_hidden_layers": 513}}, ConfigTooLargeError, None),
        ({"config": {**TINY_LLAMA, "auto_map": {}}}, ModelConfigError, None),
        ({"config": {**TINY_LLAMA, "notes": "x" * 300_000}}, ConfigTooLargeError, None),
    ],
)
def test_the_cheap_key_refuses_what_its_steps_check_as_load_model_config_does(
    model: dict[str, Any], error: type[ModelConfigError], field: str | None
) -> None:
    with pytest.raises(error) as cheap:
        model_config_key(model)
    with pytest.raises(error) as full:
        load_model_config(model)
    assert cheap.value.field == full.value.field
    assert str(cheap.value) == str(full.value)
    if field is not None:
        assert cheap.value.field == field


def test_a_preset_over_the_cheap_limits_names_the_preset_in_both() -> None:
    limits = ConfigLimits(max_layers=16)
    with pytest.raises(ConfigTooLargeError) as caught:
        model_config_key({"preset": "llama-3.1-8b"}, limits=limits)
    assert caught.value.field == "model.preset"
    assert "llama-3.1-8b" in str(caught.value)


# --- model classes and the meta build ---------------------------------------


@pytest.mark.parametrize(
    ("config", "architecture"),
    [
        ({"model_type": "llama"}, "LlamaForCausalLM"),
        ({"model_type": "t5"}, "T5ForConditionalGeneration"),
        ({"model_type": "bert"}, "BertForMaskedLM"),
        ({"model_type": "gemma3"}, "Gemma3ForConditionalGeneration"),
        ({"model_type": "llama", "architectures": ["LlamaForSequenceClassification"]}, None),
        ({"model_type": "llama", "architectures": ["BertForMaskedLM"]}, "LlamaForCausalLM"),
        ({"model_type": "llama", "architectures": ["os.system"]}, "LlamaForCausalLM"),
    ],
)
def test_architecture_comes_from_the_auto_mappings(
    config: dict[str, Any], architecture: str | None
) -> None:
    tiny = {"num_hidden_layers": 1} if config["model_type"] == "llama" else {}
    cfg = load_model_config({"config": {**config, **tiny}})
    expected = architecture or config["architectures"][0]
    assert cfg.architecture == expected


def test_build_is_on_meta_with_the_declared_architecture() -> None:
    cfg = load_model_config({"config": TINY_LLAMA})
    model = build_meta_model(cfg)
    assert type(model).__name__ == cfg.architecture
    assert {p.device.type for p in model.parameters()} == {"meta"}
    # embed + 2 x (attention + MLP + 2 norms) + final norm + untied head
    attention = 64 * 64 * 2 + 64 * 32 * 2
    expected = 256 * 64 + 2 * (attention + 3 * 64 * 128 + 2 * 64) + 64 + 256 * 64
    assert count_parameters(model) == expected


@pytest.mark.parametrize(
    ("attention", "implementation"),
    [("eager", "eager"), ("sdpa", "sdpa"), ("flash_attention_2", "sdpa"), (None, "sdpa")],
)
def test_build_sets_the_attention_implementation(
    attention: str | None, implementation: str
) -> None:
    model = build_meta_model(load_model_config({"config": TINY_LLAMA}), attention=attention)
    assert model.config._attn_implementation == implementation


@pytest.mark.parametrize("attention", ["sdpa", "flash_attention_2"])
def test_a_family_without_sdpa_builds_eager(attention: str) -> None:
    model = build_meta_model(load_model_config({"preset": "gemma-2-9b"}), attention=attention)
    assert type(model)._supports_sdpa is False
    assert model.config._attn_implementation == "eager"


@pytest.mark.parametrize("attention", ["flash", "", 3])
def test_build_rejects_unknown_attention(attention: object) -> None:
    with pytest.raises(ModelConfigError) as caught:
        build_meta_model(load_model_config({"config": TINY_LLAMA}), attention=attention)
    assert caught.value.field == "attention"


def test_build_checks_the_built_parameter_count() -> None:
    cfg = load_model_config({"preset": "gpt2"})
    with pytest.raises(ConfigTooLargeError) as caught:
        build_meta_model(cfg, limits=ConfigLimits(max_parameters=100_000_000))
    assert "as built" in str(caught.value)


def test_unbuildable_config_is_a_model_config_error() -> None:
    cfg = load_model_config({"config": {**TINY_LLAMA, "hidden_act": "no-such-act"}})
    with pytest.raises(ModelConfigError) as caught:
        build_meta_model(cfg)
    assert caught.value.field == "model.config"


def test_limits_must_be_positive_ints() -> None:
    with pytest.raises(ValueError, match="max_layers"):
        ConfigLimits(max_layers=0)
    with pytest.raises(ValueError, match="max_parameters"):
        ConfigLimits(max_parameters=2e12)  # type: ignore[arg-type]


# --- no network, no heavy imports ------------------------------------------


def test_load_and_build_touch_no_network(monkeypatch) -> None:
    import huggingface_hub
    import transformers.utils.hub as transformers_hub

    attempts: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> None:
        attempts.append(repr(args)[:80])
        raise OSError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", refuse)
    monkeypatch.setattr(huggingface_hub.file_download, "hf_hub_download", refuse)
    monkeypatch.setattr(transformers_hub, "hf_hub_download", refuse)
    monkeypatch.setattr(transformers_hub, "cached_file", refuse)
    monkeypatch.setattr(transformers_hub, "cached_files", refuse)
    for model in ({"preset": "gemma-3-4b"}, {"preset": "t5-base"}, {"config": TINY_LLAMA}):
        build_meta_model(load_model_config(model))
    assert attempts == []


def test_importing_the_model_modules_loads_no_torch() -> None:
    code = (
        "import sys, ckpt_core._configs.model_config, ckpt_core._configs.presets\n"
        "import ckpt_core._dry_run\n"
        "import ckpt_core._configs.config_json\n"
        "ckpt_core._configs.presets.list_presets()\n"
        "ckpt_core._configs.config_json.ConfigLimits()\n"
        "heavy = [m for m in ('torch', 'transformers', 'pydantic', 'fastapi')"
        " if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
