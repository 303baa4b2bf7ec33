"""Bundled presets: every required model, real sizes, clean provenance, clear errors."""

from __future__ import annotations

import functools
import json
from importlib import resources

import pytest

from ckpt_core import UnknownPresetError
from ckpt_core._configs.model_config import build_meta_model, count_parameters, load_model_config
from ckpt_core._configs.presets import PresetInfo, list_presets, load_preset, preset_names

REQUIRED = (
    "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b",
    "llama-3.1-70b", "mistral-7b-v0.3", "mixtral-8x7b", "qwen2.5-0.5b", "qwen2.5-1.5b",
    "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b", "qwen3-8b", "qwen3-30b-a3b",
    "gemma-2-9b", "gemma-3-4b", "phi-3-mini", "phi-4", "gpt2", "falcon-7b", "olmo-2-7b",
    "t5-base", "bert-base-uncased",
)  # fmt: skip

# The model card's figure is rounded (e.g. "220M" for t5-base, whose checkpoint
# holds 222.9M with the shared embedding counted once); 3% covers the rounding
# and nothing else: a wrong width or layer count moves a model by far more.
PUBLISHED_TOLERANCE = 0.03
ESTIMATE_TOLERANCE = 0.10


@functools.cache
def built_parameters(name: str) -> int:
    """Parameters of the preset's model built on meta (once per test session)."""
    return count_parameters(build_meta_model(load_model_config({"preset": name})))


def test_every_required_preset_is_bundled() -> None:
    missing = sorted(set(REQUIRED) - set(preset_names()))
    assert not missing


def test_list_presets_describes_each_file() -> None:
    infos = list_presets()
    assert [info.name for info in infos] == preset_names()
    for info in infos:
        assert isinstance(info, PresetInfo)
        config = load_preset(info.name)
        assert info.model_type == config["model_type"]
        assert info.architecture == config["architectures"][0]
        assert info.source.endswith("config.json")
        assert "/" in info.source  # a Hub repository id
        assert info.published_parameters > 10_000_000
        assert json.loads(json.dumps(info.to_dict())) == info.to_dict()


def test_preset_files_carry_provenance_and_no_remote_code() -> None:
    folder = resources.files("ckpt_core").joinpath("presets")
    for name in preset_names():
        raw = json.loads(folder.joinpath(f"{name}.json").read_text("utf-8"))
        assert raw["_source"] and raw["_published_parameters"] > 0
        assert "auto_map" not in json.dumps(raw)


def test_load_preset_strips_provenance_and_returns_a_fresh_copy() -> None:
    config = load_preset("llama-3.1-8b")
    assert not {"_source", "_published_parameters"} & set(config)
    assert config["hidden_size"] == 4096
    config["hidden_size"] = 1
    config["rope_scaling"]["factor"] = 0.0
    again = load_preset("llama-3.1-8b")
    assert again["hidden_size"] == 4096
    assert again["rope_scaling"]["factor"] == 8.0


def test_preset_names_are_case_insensitive_and_trimmed() -> None:
    assert load_preset(" Llama-3.1-8B ") == load_preset("llama-3.1-8b")


@pytest.mark.parametrize("name", ["llama-3.1-9b", "", "gpt2.json", "../gpt2", 7, None])
def test_unknown_preset_names_the_field_and_the_known_names(name: object) -> None:
    with pytest.raises(UnknownPresetError) as caught:
        load_preset(name)
    assert caught.value.field == "model.preset"
    assert "llama-3.1-8b" in str(caught.value) and "t5-base" in str(caught.value)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("info", list_presets(), ids=lambda info: info.name)
def test_built_model_matches_the_published_size(info: PresetInfo) -> None:
    built = built_parameters(info.name)
    error = abs(built - info.published_parameters) / info.published_parameters
    assert error <= PUBLISHED_TOLERANCE, (built, info.published_parameters)


@pytest.mark.parametrize("info", list_presets(), ids=lambda info: info.name)
def test_analytic_estimate_is_close_to_the_built_model(info: PresetInfo) -> None:
    approx = load_model_config({"preset": info.name}).approx_parameters
    built = built_parameters(info.name)
    assert abs(approx - built) / built <= ESTIMATE_TOLERANCE, (approx, built)
