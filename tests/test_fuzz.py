"""Contract fuzzing: schemathesis against the committed openapi/openapi.json and the ASGI app.

Every operation of the document gets at least ``FUZZ_EXAMPLES`` generated
requests (default 1000, what CI runs; ``FUZZ_EXAMPLES=50`` for a quick local
run), schema-valid and schema-violating, through every middleware (the app
runs with auth and CORS on and sends the token).  Checks: schemathesis'
defaults as they are - no 5xx, responses conform to the document (status
codes, content types, headers, bodies), schema-valid requests are accepted
and schema-violating ones refused.  The app runs with the default settings:
the committed document is its contract.

Two values are opaque to any schema, and generated here from what ckpt_core
accepts instead of from the document: an inline ``model.config`` (an HF
config.json; whether transformers builds it is not a JSON Schema question),
and ``workload.lora_targets`` (suffixes of the linear layers of THAT model).
Two rules of ``gpus_per_node`` the document says in words: it divides
``world_size`` (beyond JSON Schema), and it is given with ``host_memory_gb`` when
``world_size`` > 1 (stated in words to keep the document within what the
generator can take, see service/schema_rules.py); a well-typed request is made to
keep both.
A well-typed value in those places is swapped for a real one (a tiny config of
a supported family; suffixes of the model's block linears); an ill-typed one
is left as generated, so schema-violating requests stay violations.  A second
test sends configs of real families with junk keys and checks every answer
against the document.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from schemathesis.config import SchemathesisConfig

import ckpt_core
from ckpt_core._planning.workload import MAX_WORLD_SIZE
from service.app import create_app
from service.settings import Settings
from tests import _model_configs
from tests._tiny_models import ARCHS, tiny_config

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
DOCUMENT = REPO / "openapi" / "openapi.json"
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "1000"))
TOKEN = "fuzz-" + "0123456789abcdef" * 2
AUTH = {"Authorization": f"Bearer {TOKEN}"}

# schemathesis' default checks, as they are: no expected status widened.  The
# time limit covers the first dry run, which waits for the worker's warm-up
# (seconds on a busy machine): the client's cut-off would cancel the request.
CONFIG = SchemathesisConfig.from_dict({"request-timeout": 120})

# schemathesis starts the app's lifespan (its dry-run worker) on the first request
# of each test and stops it when the test ends.
app = create_app(
    Settings(
        dry_run_workers=1,
        log_level="warning",
        auth_tokens=TOKEN,
        cors_origins="https://fuzz.example",
    )
)
schema = schemathesis.openapi.from_path(DOCUMENT, config=CONFIG)
schema.app = app

_FUZZ_SETTINGS = hypothesis.settings(
    max_examples=EXAMPLES,
    deadline=None,  # the first dry run waits for the worker's warm-up
    database=None,  # nothing written into the tree
    suppress_health_check=list(HealthCheck),
)


@functools.cache
def _tiny(arch: str, layers: int) -> dict[str, Any]:
    # Positions as long as any workload may ask for: families with learned
    # positions (GPT-2, BERT) refuse a longer sequence, a rule of the config.
    config = tiny_config(arch, num_layers=layers).to_dict()
    for key in ("n_positions", "max_position_embeddings"):
        if key in config:
            config[key] = ckpt_core.MAX_SEQ_LEN
    return json.loads(json.dumps(config))  # as JSON carries it (string keys)


_REAL_CONFIGS = st.builds(_tiny, st.sampled_from(ARCHS), st.integers(1, 4))
# Measuring BART on the meta device fails inside transformers ("Tensor.item()
# cannot be called on meta tensors"), answered 422 dry_run_failed: a known gap of
# the measurement (ckpt_core), not of the contract; its build alone works.
_MEASURE_FAILS: frozenset[str] = frozenset({"bart"})
_MEASURABLE_CONFIGS = st.builds(
    _tiny, st.sampled_from([a for a in ARCHS if a not in _MEASURE_FAILS]), st.integers(1, 4)
)


@functools.cache
def _config_of_type(model_type: str) -> dict[str, Any] | None:
    """A real config of `model_type`: a tiny one, else a bundled preset's, else one of the
    memory model's test configs (types with neither: mT5, Mistral 3, dots.llm1, GLM-4.7
    Flash) cut to two layers."""
    for arch in ARCHS:
        config = _tiny(arch, 2)
        if config["model_type"] == model_type:
            return config
    for preset in ckpt_core.list_presets():
        if preset.model_type == model_type:
            return ckpt_core.load_preset(preset.name)
    for value in vars(_model_configs).values():
        if isinstance(value, dict) and value.get("model_type") == model_type:
            return _two_layers(value)
    return None


_LAYER_KEYS = ("num_hidden_layers", "num_layers", "num_decoder_layers")


def _two_layers(config: dict[str, Any]) -> dict[str, Any]:
    """`config` (and its text config) with at most two layers per stack."""
    cut = {
        key: min(value, 2) if key in _LAYER_KEYS and isinstance(value, int) else value
        for key, value in config.items()
    }
    if isinstance(cut.get("text_config"), dict):
        cut["text_config"] = _two_layers(cut["text_config"])
    return cut


def _real_config(
    path: str, config: dict[str, Any], measured: bool
) -> st.SearchStrategy[dict[str, Any]] | None:
    """A real config for a well-typed generated one, or None to keep it as generated.

    /resolve's document also says which model types the estimate knows: the
    generated type is kept (a type outside that list stays a violation).
    """
    if path != "/resolve":
        return _MEASURABLE_CONFIGS if measured else _REAL_CONFIGS
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in ckpt_core.ESTIMATE_FAMILIES:
        return None
    real = _config_of_type(model_type)
    return None if real is None else st.just(real)


@functools.cache
def _linears(model_json: str) -> tuple[str, ...]:
    """The linear names of a model, as ckpt_core lists them when a target misses."""
    try:
        ckpt_core.make_plan(
            "full",
            model=json.loads(model_json),
            workload={"seq_len": 8, "method": "lora", "lora_targets": ["\x00"]},
        )
    except ckpt_core.InvalidWorkloadError as exc:
        listed = exc.message.split("its linears are ", 1)[1].split(";")[0]
        return tuple(listed.split(", "))
    raise AssertionError("a target that matches nothing was accepted")


def _is_targets(value: object) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, str) and t.strip() for t in value)
    )


def _with_real_targets(body: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    workload, model = body.get("workload"), body.get("model")
    if not (isinstance(workload, dict) and _is_targets(workload.get("lora_targets"))):
        return st.just(body)
    try:
        names = _linears(json.dumps(model, sort_keys=True))
    except ckpt_core.CkptError:
        return st.just(body)  # the request is invalid anyway (no model, a bad one)
    suffixes = sorted({n.rsplit(".", 1)[-1] for n in names} | set(names))
    targets = st.lists(st.sampled_from(suffixes), min_size=1, max_size=3)
    return targets.map(functools.partial(_set_targets, body))


# Named functions, not lambdas: hypothesis reads a lambda's source to describe
# it, scanning sys.modules while the app's threads may be importing.
def _set_targets(body: dict[str, Any], targets: list[str]) -> dict[str, Any]:
    return {**body, "workload": {**body["workload"], "lora_targets": targets}}


def _set_config(body: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    return {**body, "model": {**body["model"], "config": config}}


def _whole(value: object) -> int | None:
    """`value` as JSON Schema's integer (4 and 4.0), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if float(value).is_integer() else None


def _node_rules(body: Any) -> Any:
    """The two rules of ``gpus_per_node`` the document says in words: it divides
    ``world_size``, and it is given with ``host_memory_gb`` when ``world_size`` > 1.

    A well-typed request is made to keep them (the gcd; the whole world as one
    node); anything else stays as generated, so an invalid request stays invalid.
    """
    workload = body.get("workload") if isinstance(body, dict) else None
    if not isinstance(workload, dict):
        return body
    world = _whole(workload.get("world_size", 1))
    if world is None or world < 1:
        return body
    per_node = workload.get("gpus_per_node")
    host = workload.get("host_memory_gb")
    if per_node is None and world > 1 and _is_number(host):
        return _with_nodes(body, world)
    per_node = _whole(per_node)
    # Out of the document's range it is a violation as generated: left as it is.
    if per_node is None or not 1 <= per_node <= MAX_WORLD_SIZE or world % per_node == 0:
        return body
    return _with_nodes(body, math.gcd(per_node, world))


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _with_nodes(body: dict[str, Any], per_node: int) -> dict[str, Any]:
    return {**body, "workload": {**body["workload"], "gpus_per_node": per_node}}


@schema.hook
def flatmap_body(context: Any, body: Any) -> st.SearchStrategy[Any]:
    """Swap the opaque values (see the module docstring) for real ones when well-typed."""
    if not isinstance(body, dict):
        return st.just(body)
    body = _node_rules(body)
    model = body.get("model")
    if isinstance(model, dict) and isinstance(model.get("config"), dict):
        measured = isinstance(body.get("measure"), dict)
        configs = _real_config(context.operation.path, model["config"], measured)
        if configs is not None:
            with_config = configs.map(functools.partial(_set_config, body))
            return with_config.flatmap(_with_real_targets)
    return _with_real_targets(body)


def _operations_with_input() -> set[str]:
    document = json.loads(DOCUMENT.read_text("utf-8"))
    return {
        f"{method.upper()} {path}"
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if operation.get("parameters") or operation.get("requestBody")
    }


@pytest.fixture
def sent() -> Iterator[Counter[str]]:
    """Requests one operation's test sent; checked when it ends: at least EXAMPLES for an
    operation that takes input (GET /presets takes none: hypothesis stops at once)."""
    requests: Counter[str] = Counter()
    yield requests
    assert requests, "no request was sent"
    for label, count in requests.items():
        wanted = EXAMPLES if label in _operations_with_input() else 1
        assert count >= wanted, f"{label}: {count} requests, wanted >= {wanted}"


@schema.parametrize()
@_FUZZ_SETTINGS
def test_every_operation_keeps_its_contract(case: Any, sent: Counter[str]) -> None:
    case.call_and_validate(headers=AUTH)
    sent[case.operation.label] += 1


# Keys real configs carry, and values of every JSON type for them: what a person
# editing a config.json by hand, or a converter with a bug, could send.
_KEYS = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings",
    "num_local_experts", "num_experts", "num_experts_per_tok", "n_layer", "n_embd", "n_head",
    "d_model", "num_layers", "rope_scaling", "torch_dtype", "dtype", "attn_implementation",
    "architectures", "tie_word_embeddings", "quantization_config", "layer_types",
    "sliding_window", "text_config", "vision_config", "use_cache", "hidden_act",
    "is_encoder_decoder", "gradient_checkpointing", "pad_token_id", "rms_norm_eps",
)  # fmt: skip
_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 8),
    st.integers(0, 1 << 40),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.sampled_from(["", "sdpa", "eager", "flash_attention_2", "bfloat16", "silu", "linear"]),
    st.text(max_size=6),
)


def _nested(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(_KEYS), inner)


_VALUES = st.recursive(_LEAVES, _nested, max_leaves=6)


def _changed(arch: str, layers: int, changes: dict[str, Any]) -> dict[str, Any]:
    return {**_tiny(arch, layers), **changes}


_CONFIGS = st.builds(
    _changed,
    st.sampled_from(ARCHS),
    st.integers(1, 4),
    st.one_of(st.just({}), st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=3)),
)
_TIERS = st.sampled_from([None, False, True, "off", "full", "medium", "selective", "auto"])
_MEASURE = st.none() | st.fixed_dictionaries(
    {"seq_len": st.integers(1, 64)},
    optional={
        "micro_batch_size": st.integers(1, 2),
        "dtype": st.sampled_from(["bf16", "fp16", "fp32"]),
        "attention": st.sampled_from(["sdpa", "eager", "flash_attention_2"]),
    },
)


def test_buildable_configs_keep_the_contract() -> None:
    """Configs of real families, some with junk: every answer as documented, most 200."""
    statuses: Counter[int] = Counter()
    dry_run = schema["/dry-run"]["POST"]
    resolve = schema["/resolve"]["POST"]

    @_FUZZ_SETTINGS
    @given(config=_CONFIGS, tier=_TIERS, measure=_MEASURE, estimate=st.booleans())
    def send(config: dict[str, Any], tier: Any, measure: Any, estimate: bool) -> None:
        if estimate:
            workload = {"seq_len": (measure or {}).get("seq_len", 16)}
            body = {"tier": tier, "gpu": "A100-80GB", "model": {"config": config}}
            case = resolve.Case(body={**body, "workload": workload}, media_type="application/json")
        else:
            body = {"tier": tier, "model": {"config": config}, "measure": measure}
            case = dry_run.Case(body=body, media_type="application/json")
        response = case.call_and_validate(headers=AUTH)
        statuses[response.status_code] += 1

    send()
    assert statuses.total() >= EXAMPLES
    # The success path is what this test is for: most configs must build.
    assert statuses[200] >= statuses.total() // 4, statuses
