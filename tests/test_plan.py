"""The plan object and the TrainingArguments kwargs by transformers version."""

from __future__ import annotations

import json

import pytest

import ckpt_core
from ckpt_core._planning.training_args import parse_transformers_version


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("5.24.0", (5, 24, 0)),
        ("4.57", (4, 57, 0)),
        ("v5.16.1", (5, 16, 1)),
        ("5.23.0.dev0", (5, 22, 999)),  # a boundary's pre-release is before it
        ("5.16.0rc1", (5, 15, 999)),
        ("5.0.0a1", (4, 999, 999)),
        ("5.24.0+cpu", (5, 24, 0)),
        ("5.24.0.post1", (5, 24, 0)),
    ],
)
def test_version_parsing(text: str, parsed: tuple[int, int, int]) -> None:
    assert parse_transformers_version(text) == parsed


@pytest.mark.parametrize(
    "text", ["", "five", "5", "5.x", "5.24.0-foo", 5.24, "5.24.0 beta", "５.２４.０"]
)
def test_bad_versions_are_errors(text: object) -> None:
    with pytest.raises(ckpt_core.UnsupportedTransformersVersionError) as raised:
        ckpt_core.make_plan("full", transformers_version=text)  # type: ignore[arg-type]
    assert raised.value.field == "transformers_version"


@pytest.mark.parametrize("version", ["4.34.1", "4.0.0", "3.5.1", "4.35.0.dev0"])
def test_versions_without_non_reentrant_kwargs_are_refused(version: str) -> None:
    with pytest.raises(ckpt_core.UnsupportedTransformersVersionError, match=r"4\.35\.0"):
        ckpt_core.resolve_gradient_checkpointing("full", transformers_version=version)


@pytest.mark.parametrize(
    ("version", "on_key"),
    [
        ("4.35.0", "gradient_checkpointing"),
        ("5.22.2", "gradient_checkpointing"),
        ("5.23.0", "activation_checkpointing"),
        ("5.24.0", "activation_checkpointing"),
    ],
)
def test_field_names_follow_the_version(version: str, on_key: str) -> None:
    for tier in ("off", "full", "medium", "selective"):
        kwargs = ckpt_core.resolve_gradient_checkpointing(tier, transformers_version=version)
        assert set(kwargs) <= {on_key, f"{on_key}_kwargs"}
        assert on_key in kwargs  # always explicit, never left to a trainer's default


@pytest.mark.parametrize(
    ("version", "hooks", "hf_on"),
    [("5.15.1", "medium", False), ("5.16.0", None, True), ("5.24.0", None, True)],
)
def test_medium_is_native_only_where_every_n_layers_exists(
    version: str, hooks: str | None, hf_on: bool
) -> None:
    plan = ckpt_core.make_plan("medium", transformers_version=version)
    assert plan.granularity == "medium"
    assert plan.hooks == hooks
    on_key = next(key for key in plan.training_arguments if not key.endswith("_kwargs"))
    assert plan.training_arguments[on_key] is hf_on
    if hf_on:
        assert plan.training_arguments[f"{on_key}_kwargs"]["every_n_layers"] == 2


def test_selective_turns_hf_off_and_asks_for_hooks() -> None:
    plan = ckpt_core.make_plan(" Selective ", transformers_version="5.24.0")
    assert plan.tier == "selective"
    assert plan.training_arguments == {"activation_checkpointing": False}
    assert plan.hooks == "selective"
    assert "selective hooks" in plan.reason


def test_plan_round_trips_through_json() -> None:
    plan = ckpt_core.make_plan("auto", 40, transformers_version="5.10.0")
    data = json.loads(json.dumps(plan.to_dict()))
    assert ckpt_core.Plan.from_dict(data) == plan
    data["training_arguments"]["gradient_checkpointing"] = True  # a copy, not the plan's dict
    assert plan.training_arguments == {"gradient_checkpointing": False}


def test_default_version_is_the_installed_one() -> None:
    import transformers

    plan = ckpt_core.make_plan("full")
    assert plan.transformers_version == transformers.__version__


@pytest.mark.parametrize(
    ("tier", "memory", "fragment"),
    [
        ("auto", None, "auto without GPU memory: full"),
        ("auto", 16, "< 24 GiB -> full"),
        ("auto", 40, "between 24 and 80 GiB -> medium"),
        ("auto", 141, "> 80 GiB -> selective"),
        ("full", None, "tier 'full' requested"),
        (None, None, "HF checkpointing explicitly off"),
    ],
)
def test_reason_says_why(tier: object, memory: float | None, fragment: str) -> None:
    assert fragment in ckpt_core.make_plan(tier, memory).reason
