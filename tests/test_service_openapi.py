"""The committed OpenAPI document: in step with the app, valid, documented."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from openapi_spec_validator import validate

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "openapi" / "openapi.json"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_openapi", REPO / "scripts" / "gen_openapi.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return json.loads(COMMITTED.read_text("utf-8"))


def test_committed_document_matches_the_app() -> None:
    assert COMMITTED.read_text("utf-8") == _generator().render(), (
        "openapi/openapi.json is out of date: run .venv/bin/python scripts/gen_openapi.py"
    )


def test_document_is_a_valid_openapi_document(document: dict[str, Any]) -> None:
    validate(document)


def test_every_endpoint_and_only_those_are_documented(document: dict[str, Any]) -> None:
    operations = {(path, method) for path, item in document["paths"].items() for method in item}
    assert operations == {
        ("/resolve", "post"),
        ("/describe", "get"),
        ("/dry-run", "post"),
        ("/presets", "get"),
    }


def test_every_request_schema_has_examples(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    for name in ("ResolveRequest", "DryRunRequest", "ModelSpec"):
        assert schemas[name].get("examples"), name
    # /describe's query is one form-exploded object (gpu and gpu_memory_gb exclude
    # each other, which separate parameters cannot say): each property has examples.
    [query] = document["paths"]["/describe"]["get"]["parameters"]
    assert query["in"] == "query" and query["style"] == "form" and query["explode"]
    properties = query["schema"]["properties"]
    assert set(properties) == {"tier", "gpu_memory_gb", "gpu"}
    assert all(schema.get("examples") for schema in properties.values())


def test_request_fields_state_their_rules(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    resolve = schemas["ResolveRequest"]
    assert "tier" in resolve["required"] and "tier" in schemas["DryRunRequest"]["required"]
    memory = resolve["properties"]["gpu_memory_gb"]["anyOf"][0]
    assert memory == {"type": "number", "exclusiveMinimum": 0.0, "maximum": 4096.0}
    assert resolve["properties"]["tier"]["anyOf"][2]["pattern"].startswith("^[ \\t\\n\\r]*")
    workload = schemas["WorkloadSpec"]["properties"]
    assert workload["seq_len"]["maximum"] == 1 << 21 and workload["seq_len"]["type"] == "integer"
    assert "[Ll][Oo][Rr][Aa]" in workload["method"]["pattern"]


def test_every_operation_documents_its_answer_and_its_errors(document: dict[str, Any]) -> None:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            ok = operation["responses"]["200"]["content"]["application/json"]["schema"]
            assert ok.get("$ref", "").startswith("#/components/schemas/"), (path, method)
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (path, status)
    assert "429" in document["paths"]["/dry-run"]["post"]["responses"]
    assert "504" in document["paths"]["/dry-run"]["post"]["responses"]


def _schemas(node: Any) -> Any:
    """Every schema object under `node` (the values of a `properties` map, not its keys)."""
    if isinstance(node, dict):
        yield node
        for key, value in node.items():
            named = key == "properties" and isinstance(value, dict)
            children = value.values() if named else [value]
            for child in children:
                yield from _schemas(child)
    elif isinstance(node, list):
        for item in node:
            yield from _schemas(item)


def test_no_bound_is_written_in_a_keyword_json_schema_ignores(document: dict[str, Any]) -> None:
    # pydantic writes a bound it cannot place as "ge" / "le" / "gt" / "lt": a validator
    # still enforces it, but the document no longer says it (clients generate 0).
    stray = [
        (schema.get("title"), key)
        for schema in _schemas(document["components"]["schemas"])
        for key in ("ge", "le", "gt", "lt")
        if key in schema
    ]
    assert stray == []


_CROSS_FIELD = {
    "method": ("full", "lora", "qlora", None),
    "weights": ("bf16", "fp16", "fp32", "int8", "nf4", None),
    "compute": ("loaded", "autocast", None),
    "dtype": ("bf16", "fp16", "fp32", None),
}
_SHARDING = {
    "sharding": ("none", "zero1", "zero2", "zero3", None),
    "engine": ("torch", "deepspeed", None),
    "offload": ("none", "optimizer", "all", None),
    "hybrid": (False, True, None),
    "gpus_per_node": (2, None),
}


@pytest.mark.parametrize("fields", [_CROSS_FIELD, _SHARDING], ids=["precision", "sharding"])
def test_cross_field_rules_accept_what_ckpt_core_accepts(
    document: dict[str, Any], fields: dict[str, tuple[Any, ...]]
) -> None:
    """Every combination of the fields the rules name (None: the field left out):
    the document's workload schema and ckpt_core's Workload agree on each."""
    import itertools

    import jsonschema

    import ckpt_core

    workload_schema = {**document["components"]["schemas"]["WorkloadSpec"]}
    validator = jsonschema.Draft202012Validator(workload_schema)
    disagreements = []
    for values in itertools.product(*fields.values()):
        given = {k: v for k, v in zip(fields, values, strict=True) if v is not None}
        workload = {"seq_len": 8, "world_size": 4, **given}
        by_document = validator.is_valid(workload)
        try:
            ckpt_core.Workload(**workload)
        except ckpt_core.InvalidWorkloadError:
            by_ckpt_core = False
        else:
            by_ckpt_core = True
        if by_document != by_ckpt_core:
            disagreements.append((given, by_document, by_ckpt_core))
    assert disagreements == []
