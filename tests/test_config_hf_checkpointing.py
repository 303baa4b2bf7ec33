"""A config switching HF checkpointing on is bad input; a live model with it on is a conflict.

transformers turns its checkpointing on while building a model whose config
carries a truthy ``gradient_checkpointing`` (old checkpoints saved it in
config.json).  Sent as a config, that is a value to remove - the tier decides
checkpointing - so it is a `ModelConfigError` (422 from the service) naming the
key, for every use of a config; a model a caller built and switched on in
Python stays a `CheckpointConflictError`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ckpt_core import CheckpointConflictError, ModelConfigError, make_plan
from ckpt_core._configs.model_config import build_meta_model, load_model_config
from ckpt_core._dry_run import dry_run
from ckpt_core._hooks.install import is_hf_checkpointing_enabled
from ckpt_core._meta.measure import measure_activation_bytes
from tests._tiny_models import tiny_config

TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 128,
}
FIELD = "model.config.gradient_checkpointing"


def _config_error(config: dict[str, Any]) -> ModelConfigError:
    with pytest.raises(ModelConfigError) as caught:
        load_model_config({"config": config})
    return caught.value


# HF tests truthiness: a string "false" turns its checkpointing on too.
@pytest.mark.parametrize("value", [True, "false", 1, {"use_reentrant": False}])
def test_switched_on_is_refused_naming_the_key_and_what_to_do(value: object) -> None:
    error = _config_error({**TINY_LLAMA, "gradient_checkpointing": value})
    assert type(error) is ModelConfigError  # a bad value (422), not a state conflict (409)
    assert error.field == FIELD
    assert "remove 'gradient_checkpointing'" in error.message
    assert "tier decides" in error.message


@pytest.mark.parametrize("value", [False, None, 0])
def test_switched_off_builds_without_it(value: object) -> None:
    config = {**TINY_LLAMA, "gradient_checkpointing": value}
    assert not is_hf_checkpointing_enabled(build_meta_model(load_model_config({"config": config})))


def _switched_on(where: str) -> tuple[dict[str, Any], str]:
    """The flag on at the top, or in a VLM's text config (the language model's own post_init)."""
    if where == "top":
        return {**TINY_LLAMA, "gradient_checkpointing": True}, "model.config"
    config = json.loads(tiny_config("llava").to_json_string())
    config["text_config"]["gradient_checkpointing"] = True
    return config, "model.config.text_config"


@pytest.mark.parametrize("where", ["top", "text_config"])
def test_refused_where_it_would_turn_on(where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused with its path; without the check the config builds with HF's checkpointing on."""
    from ckpt_core._configs import config_json

    config, path = _switched_on(where)
    assert _config_error(config).field == f"{path}.gradient_checkpointing"
    monkeypatch.setattr(config_json, "HF_CHECKPOINTING_KEYS", frozenset())
    assert is_hf_checkpointing_enabled(build_meta_model(load_model_config({"config": config})))


def test_dry_run_and_plan_refuse_it_as_a_config_error() -> None:
    model = {"config": {**TINY_LLAMA, "gradient_checkpointing": True}}
    with pytest.raises(ModelConfigError) as dry:
        dry_run(model, "selective", measure={"seq_len": 16})
    with pytest.raises(ModelConfigError) as plan:
        make_plan("auto", gpu="A100-80GB", model=model, workload={"seq_len": 16})
    assert dry.value.field == plan.value.field == FIELD


def test_a_live_model_switched_on_in_python_is_still_a_conflict() -> None:
    model = build_meta_model(load_model_config({"config": TINY_LLAMA}))
    model.activation_checkpointing_enable()
    with pytest.raises(CheckpointConflictError, match="activation_checkpointing_disable"):
        measure_activation_bytes(model, "full", seq_len=16, micro_batch_size=1)
