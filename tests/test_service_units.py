"""Service building blocks without a server: strict JSON, negotiation, cache, settings, schemas."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ckpt_core
from ckpt_core._configs.config_json import ConfigLimits
from ckpt_core._configs.presets import PresetInfo
from ckpt_core._dry_run import DryRunReport
from ckpt_core._plan import Plan
from service.contract import GPU_CHOICE, TIER_CHOICE, VERSION_PATTERN, Choice
from service.errors import MalformedJSONError, field_path
from service.jsonbody import is_json_media_type, strict_loads
from service.negotiation import prefers_text
from service.responses import DryRunResponse, PlanResponse, PresetSummary
from service.schema_rules import learned_positions
from service.schemas import MeasureSpec, WorkloadSpec
from service.settings import Settings


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"a": NaN}', "a"),
        (b'{"a": [1, {"b": -Infinity}]}', "a[1].b"),
        (b'{"a": {"b": 1e400}}', "a.b"),
        (b'{"n": -99999999999999999999}', "n"),
        (b'{"n": ' + b"9" * 5000 + b"}", "n"),
        (b'{"k": 1, "k": 2}', "k"),
        (b"[1, 2", None),
    ],
)
def test_strict_loads_rejects_what_json_cannot_carry(raw: bytes, field: str | None) -> None:
    with pytest.raises(MalformedJSONError) as caught:
        strict_loads(raw)
    assert caught.value.field == field


def test_strict_loads_keeps_ordinary_json() -> None:
    raw = b'{"a": [1.5, -2, 9223372036854775807, null, true, "x"], "b": {"c": 1e-300}}'
    assert strict_loads(raw) == {
        "a": [1.5, -2, 9223372036854775807, None, True, "x"],
        "b": {"c": 1e-300},
    }


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        ("application/json", True),
        ("Application/JSON; charset=utf-8", True),
        ("application/problem+json", True),
        ("text/json", False),
        ("application/jsonx", False),
        ("", False),
        (None, False),
    ],
)
def test_json_media_types(content_type: str | None, expected: bool) -> None:
    assert is_json_media_type(content_type) is expected


@pytest.mark.parametrize(
    ("accept", "text"),
    [
        (None, False),
        ("text/plain", True),
        ("text/html, text/plain;q=0.5", True),
        ("text/plain;q=0.4, application/json;q=0.5", False),
        ("text/plain;q=0.5, application/json;q=0.4", True),
        ("text/plain;q=bad", False),
        ("image/png", False),
    ],
)
def test_prefers_text(accept: str | None, text: bool) -> None:
    assert prefers_text(accept) is text


@pytest.mark.parametrize(
    ("value", "canonical"),
    [
        (" Selective ", "selective"),
        ("\tAUTO\n", "auto"),
        ("", ""),
        ("  ", ""),
        ("False", "false"),
        ("fulll", None),
        ("sel ective", None),
        ("\u017felective", None),  # long s: Unicode case folding makes it "selective"
        ("selective\x0b", None),  # vertical tab: not JSON whitespace
        (1, None),
        (None, None),
    ],
)
def test_one_choice_rule_trimmed_and_ascii_case_insensitive(
    value: object, canonical: str | None
) -> None:
    assert TIER_CHOICE.canonical(value) == canonical
    assert (
        re.search(TIER_CHOICE.pattern, value) is not None if isinstance(value, str) else False
    ) is (canonical is not None)


def test_gpu_names_and_aliases_are_choices() -> None:
    assert GPU_CHOICE.canonical(" nvidia a100-sxm4-80gb ") == "NVIDIA A100-SXM4-80GB"
    assert Choice(["a.b"]).canonical("aXb") is None  # regex characters are literal


@pytest.mark.parametrize(
    ("version", "valid"),
    [
        ("5.24.0", True),
        ("4.57", True),
        ("4.35", True),
        ("4.35.0", True),
        ("4.35.0.post1", True),
        ("4.35.1rc1", True),
        ("5.23.0.dev0", True),
        ("5.1.0+local.1", True),
        ("10.0", True),
        ("4.35.0.dev0", False),  # a pre-release of the minimum is before it
        ("4.34.9", False),
        ("3.99", False),
        ("five", False),
    ],
)
def test_version_pattern_is_what_ckpt_core_plans_for(version: str, valid: bool) -> None:
    """The pattern may spell versions more strictly than ckpt_core ("05.1" is not a
    release spelling), never more loosely."""
    assert (re.search(VERSION_PATTERN, version) is not None) is valid
    if valid:
        ckpt_core.make_plan("full", transformers_version=version)
    else:
        with pytest.raises(ckpt_core.CkptError):
            ckpt_core.make_plan("full", transformers_version=version)


def test_workload_and_measure_models_have_ckpt_cores_fields() -> None:
    workload = {f.name for f in dataclasses.fields(ckpt_core.Workload)}
    assert set(WorkloadSpec.model_fields) == workload
    assert set(MeasureSpec.model_fields) == set(ckpt_core.MEASURE_FIELDS)


def test_learned_positions_are_the_presets_that_refuse_longer_sequences() -> None:
    limits = learned_positions()
    for preset in ckpt_core.list_presets():
        model = {"preset": preset.name}
        limit = limits.get(preset.name)
        if limit is None:
            ckpt_core.make_plan("full", model=model, workload={"seq_len": ckpt_core.MAX_SEQ_LEN})
            continue
        ckpt_core.make_plan("full", model=model, workload={"seq_len": limit})
        with pytest.raises(ckpt_core.InvalidWorkloadError):
            ckpt_core.make_plan("full", model=model, workload={"seq_len": limit + 1})


@pytest.mark.parametrize(
    ("loc", "path"),
    [
        (("body", "model", "config", "layers", 0), "model.config.layers[0]"),
        (("body",), "body"),
        (("query", "gpu_memory_gb"), "gpu_memory_gb"),
        (("workload", "seq_len"), "workload.seq_len"),
        ((), None),
    ],
)
def test_field_path(loc: tuple[int | str, ...], path: str | None) -> None:
    assert field_path(loc) == path


def test_settings_read_the_prefixed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_DRY_RUN_WORKERS", "3")
    monkeypatch.setenv("CKPT_CONFIG_LIMITS__MAX_LAYERS", "64")
    settings = Settings()
    assert settings.dry_run_workers == 3
    assert settings.config_limits == ConfigLimits(max_layers=64)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CKPT_DRY_RUN_WORKRS", "3"),  # a typo must not leave the default silently
        ("CKPT_DRY_RUN_WORKERS", "0"),
        ("CKPT_DRY_RUN_TIMEOUT_S", "nan"),
        ("CKPT_CONFIG_LIMITS__MAX_LAYERS", "0"),
        ("CKPT_CONFIG_LIMITS__MAX_LAYRES", "8"),
    ],
)
def test_settings_refuse_bad_or_unknown_variables(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    setting = name.removeprefix("CKPT_").split("__")[-1]
    with pytest.raises(ValueError, match=f"(?i){setting}"):
        Settings()


@pytest.mark.parametrize(
    ("schema", "dataclass"),
    [(PlanResponse, Plan), (DryRunResponse, DryRunReport), (PresetSummary, PresetInfo)],
)
def test_response_schemas_mirror_ckpt_core(schema: type, dataclass: type) -> None:
    assert list(schema.model_fields) == [f.name for f in dataclasses.fields(dataclass)]


def test_importing_the_app_loads_no_torch() -> None:
    code = (
        "import sys, service.app; service.app.create_app(); "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_the_service_docs_document_every_setting() -> None:
    service_doc = (Path(__file__).resolve().parents[1] / "docs" / "service.md").read_text("utf-8")
    start = service_doc.index("## Settings")
    section = service_doc[start : service_doc.index("\n## ", start + 1)]
    names = [f"CKPT_{name.upper()}" for name in Settings.model_fields if name != "config_limits"]
    names += [f"CKPT_CONFIG_LIMITS__{f.name.upper()}" for f in dataclasses.fields(ConfigLimits)]
    missing = [name for name in names if f"| `{name}` |" not in section]
    assert not missing, f"docs/service.md's settings table lacks {missing}"
