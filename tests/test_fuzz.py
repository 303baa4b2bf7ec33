"""Contract fuzzing: schemathesis against the committed openapi/openapi.json and the ASGI app.

Every operation of the document gets at least ``FUZZ_EXAMPLES`` generated
requests (default 1000, what CI runs; ``FUZZ_EXAMPLES=50`` for a quick local
run), schema-valid and schema-violating, through every middleware (the app
runs with auth and CORS on and sends the token).  Checks: no 5xx, responses
conform to the document (status codes, content types, headers, bodies) and
invalid data is rejected.

Dry runs stay cheap: the fuzzed app has small config bounds, so generated
configs are refused by validation (a 422) or build in milliseconds.  Random
JSON rarely makes a buildable config, so a second test generates configs from
real model families (small sizes, random extra keys) and checks the answers
to those - successful dry runs and estimates included - against the same
document.
"""

from __future__ import annotations

import functools
import json
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

from ckpt_core._config_json import ConfigLimits
from service.app import create_app
from service.settings import Settings
from tests._tiny_models import ARCHS, tiny_config

REPO = Path(__file__).resolve().parents[1]
DOCUMENT = REPO / "openapi" / "openapi.json"
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "1000"))
TOKEN = "fuzz-" + "0123456789abcdef" * 2
AUTH = {"Authorization": f"Bearer {TOKEN}"}

# Small enough that anything valid builds in milliseconds (a 4-layer Llama
# with hidden size 256 does); presets over them are refused with a 422.
FUZZ_LIMITS = ConfigLimits(
    max_layers=4,
    max_hidden_size=256,
    max_vocab_size=4096,
    max_experts=4,
    max_positions=1 << 20,
    max_parameters=20_000_000,
    max_expert_instances=16,
    max_config_bytes=16_384,
)

# schemathesis' default checks, as they are: no expected status widened.
CONFIG = SchemathesisConfig.from_dict({})

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
    [(label, count)] = requests.items()
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
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(_KEYS), inner),
    max_leaves=6,
)


@functools.cache
def _tiny(arch: str, layers: int) -> dict[str, Any]:
    return tiny_config(arch, num_layers=layers).to_dict()


_CONFIGS = st.builds(
    lambda arch, layers, changes: {**_tiny(arch, layers), **changes},
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
