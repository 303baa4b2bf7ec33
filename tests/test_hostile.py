"""Hostile input against a real ``python -m service`` process, with the network blocked.

Every case gets a 4xx with the JSON error shape within 1 s; the server's RSS
stays bounded; and nothing is attempted on the network.  The proof of the
last: the process (and its forkserver, whose forked workers inherit it) runs
with tests/netguard/sitecustomize.py, an audit hook that refuses and logs
every connect / sendto to a non-loopback address and every non-localhost
name lookup - and the log must stay empty.  ``HF_HUB_OFFLINE`` is NOT set
for this server: nothing may even try to reach the Hub.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._server import (
    REPO,
    ServerProcess,
    forkserver_processes,
    raw_exchange,
    start_server,
)
from tests.conftest import TINY_CONFIG

NETGUARD = REPO / "tests" / "netguard"
BODY_TIMEOUT_S = 0.5
ANSWER_WITHIN_S = 1.0
MAX_BODY = 1 << 20  # the default CKPT_MAX_BODY_BYTES
JSON = {"content-type": "application/json"}


@dataclass
class Guarded:
    server: ServerProcess
    net_log: Path

    def attempts(self) -> list[str]:
        return self.net_log.read_text().splitlines() if self.net_log.exists() else []

    def guarded_pids(self) -> set[int]:
        loaded = self.net_log.with_suffix(".processes")
        return {int(line) for line in loaded.read_text().split()} if loaded.exists() else set()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    tmp = tmp_path_factory.mktemp("hostile")
    net_log = tmp / "netguard.log"
    server = start_server(
        tmp / "server.log",
        {"DRY_RUN_WORKERS": "1", "BODY_TIMEOUT_S": str(BODY_TIMEOUT_S), "LOG_LEVEL": "warning"},
        {
            "PYTHONPATH": os.pathsep.join([str(NETGUARD), os.environ.get("PYTHONPATH", "")]),
            "NETGUARD_LOG": str(net_log),
            "HF_HUB_OFFLINE": "0",
        },
    )
    try:
        yield Guarded(server, net_log)
    finally:
        server.stop()


def _config(**overrides: Any) -> dict[str, Any]:
    return {"model": {"config": {**TINY_CONFIG, **overrides}}, "tier": "full"}


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


@dataclass(frozen=True)
class Case:
    """One hostile request and the answer it must get."""

    path: str
    body: bytes | None
    status: int
    error: str
    field_path: str | None = None
    headers: dict[str, str] = field(default_factory=lambda: dict(JSON))
    method: str = "POST"


TRILLION_MOE = {
    "model_type": "mixtral",
    "hidden_size": 16384,
    "intermediate_size": 65536,
    "num_hidden_layers": 128,
    "num_attention_heads": 128,
    "num_key_value_heads": 8,
    "num_local_experts": 1024,
    "num_experts_per_tok": 8,
    "vocab_size": 128000,
}
DEEP = b"[" * 10_000 + b"]" * 10_000

CASES: dict[str, Case] = {
    # Sizes: refused from the config, before anything is built.
    "million layers": Case(
        "/dry-run",
        _json(_config(num_hidden_layers=1_000_000)),
        422,
        "config_too_large",
        "model.config.num_hidden_layers",
    ),
    "hidden 10^7": Case(
        "/dry-run",
        _json(_config(hidden_size=10**7)),
        422,
        "config_too_large",
        "model.config.hidden_size",
    ),
    "hidden 10^7 estimate": Case(
        "/resolve",
        _json({**_config(hidden_size=10**7), "gpu": "H100-80GB", "workload": {"seq_len": 8}}),
        422,
        "config_too_large",
        "model.config.hidden_size",
    ),
    "trillion-parameter MoE": Case(
        "/dry-run",
        _json({"model": {"config": TRILLION_MOE}, "tier": "full"}),
        422,
        "config_too_large",
        "model.config",
    ),
    "config over its byte limit": Case(
        "/dry-run",
        _json(_config(**{f"k{i}": "x" * 64 for i in range(4096)})),
        422,
        "config_too_large",
    ),
    # The body itself.
    "10 MB body": Case("/resolve", b" " * (10 << 20), 413, "body_too_large"),
    "10,000-deep JSON": Case("/resolve", DEEP, 400, "malformed_json"),
    "10,000-deep JSON in a config": Case(
        "/dry-run", b'{"tier": "full", "model": {"config": ' + DEEP + b"}}", 400, "malformed_json"
    ),
    "NaN": Case("/resolve", b'{"tier": "auto", "gpu_memory_gb": NaN}', 400, "malformed_json"),
    "Infinity": Case(
        "/dry-run", b'{"model": {"config": {"hidden_size": Infinity}}}', 400, "malformed_json"
    ),
    "-Infinity": Case("/resolve", b'{"gpu_memory_gb": -Infinity}', 400, "malformed_json"),
    "1e999": Case("/resolve", b'{"gpu_memory_gb": 1e999}', 400, "malformed_json"),
    "integer beyond 64 bits": Case(
        "/dry-run", _json(_config(vocab_size=10**30)), 400, "malformed_json"
    ),
    "duplicate keys": Case("/resolve", b'{"tier": "off", "tier": "full"}', 400, "malformed_json"),
    "not UTF-8": Case("/resolve", b'{"tier": "\xff\xfe"}', 400, "malformed_json"),
    "lone surrogate": Case("/resolve", b'{"tier": "\\ud800"}', 400, "malformed_json", "tier"),
    "lone surrogate key": Case(
        "/dry-run",
        b'{"tier": "full", "model": {"config": {"\\udfff": 1}}}',
        400,
        "malformed_json",
    ),
    "a list, not an object": Case("/resolve", b"[1, 2]", 422, "invalid_request"),
    "no body": Case("/dry-run", b"", 422, "invalid_request"),
    # Strings where numbers belong.
    "gpu_memory_gb as a string": Case(
        "/resolve", _json({"tier": "auto", "gpu_memory_gb": "80"}), 422, "invalid_gpu_memory"
    ),
    "hidden_size as a string": Case(
        "/dry-run",
        _json(_config(hidden_size="4096")),
        422,
        "invalid_model_config",
        "model.config.hidden_size",
    ),
    "seq_len as a string": Case(
        "/dry-run",
        _json({**_config(), "measure": {"seq_len": "2048"}}),
        422,
        "invalid_workload",
        "measure.seq_len",
    ),
    # Unicode where a tier name belongs: no normalisation into a valid tier.
    **{
        f"tier {name}": Case("/resolve", _json({"tier": tier}), 422, "invalid_tier", "tier")
        for name, tier in {
            "fullwidth": "ｆｕｌｌ",
            "zero-width space": "full\u200b",
            "right-to-left override": "\u202efull",
            "diacritics": "fülł",
            "emoji": "🚀",
            "NUL": "full\x00",
        }.items()
    },
    "tier fullwidth (describe)": Case(
        "/describe?tier=%EF%BD%86%EF%BD%95%EF%BD%8C%EF%BD%8C",
        None,
        422,
        "invalid_tier",
        "tier",
        {},
        "GET",
    ),
    # Remote code and unknown models: refused without any download.
    "auto_map": Case(
        "/dry-run",
        _json(_config(auto_map={"AutoModelForCausalLM": "evil--model.modeling.Evil"})),
        422,
        "invalid_model_config",
        "model.config.auto_map",
    ),
    "trust_remote_code": Case(
        "/dry-run",
        _json(_config(trust_remote_code=True)),
        422,
        "invalid_model_config",
        "model.config.trust_remote_code",
    ),
    "unknown model_type": Case(
        "/dry-run",
        _json({"model": {"config": {"model_type": "evilnet"}}, "tier": "full"}),
        422,
        "invalid_model_config",
        "model.config.model_type",
    ),
    "a Hub repository as preset": Case(
        "/dry-run",
        _json({"model": {"preset": "meta-llama/Llama-2-7b-hf"}, "tier": "full"}),
        422,
        "unknown_preset",
        "model.preset",
    ),
    "HF checkpointing on in the config": Case(
        "/dry-run",
        _json(_config(gradient_checkpointing=True)),
        422,
        "invalid_model_config",
        "model.config.gradient_checkpointing",
    ),
    # Content types.
    **{
        f"content type {content_type or 'missing'}": Case(
            "/resolve",
            b'{"tier": "full"}',
            415,
            "unsupported_media_type",
            headers={"content-type": content_type} if content_type else {},
        )
        for content_type in (
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/xml",
            "application/jsonx",
            None,
        )
    },
}


def _send(server: ServerProcess, case: Case) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = httpx.request(
        case.method,
        f"{server.base_url}{case.path}",
        content=case.body,
        headers=case.headers,
        timeout=10,
    )
    return response, time.monotonic() - started


def _assert_error_shape(body: dict[str, Any]) -> None:
    assert set(body) == {"error", "detail", "field"}, body
    assert isinstance(body["detail"], str) and body["detail"]


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_input_gets_a_clear_4xx_fast(guarded: Guarded, name: str) -> None:
    case = CASES[name]
    response, elapsed = _send(guarded.server, case)
    assert response.status_code == case.status, response.text[:500]
    body = response.json()
    _assert_error_shape(body)
    assert body["error"] == case.error, body
    if case.field_path is not None:
        assert body["field"] == case.field_path, body
    assert elapsed < ANSWER_WITHIN_S, f"{name}: answered in {elapsed:.2f} s"
    assert guarded.attempts() == []


def _trickle(byte: bytes, every_s: float) -> Iterator[bytes]:
    for _ in range(600):
        time.sleep(every_s)
        yield byte


@pytest.mark.parametrize(
    ("name", "chunks"),
    [
        ("trickles its body", lambda: _trickle(b" ", 0.05)),
        ("sends headers, then nothing", lambda: iter(())),
    ],
)
def test_a_slow_client_is_cut_off_with_408(guarded: Guarded, name: str, chunks: Any) -> None:
    head = (
        b"POST /resolve HTTP/1.1\r\nHost: service\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n{"
    )
    answer = raw_exchange(guarded.server.port, head, chunks())
    assert answer.status == 408, answer.body
    _assert_error_shape(answer.body)
    assert answer.body["error"] == "body_timeout"
    assert BODY_TIMEOUT_S <= answer.seconds < ANSWER_WITHIN_S, f"{name}: {answer.seconds:.2f} s"
    assert answer.headers["connection"] == "close" and answer.closed
    assert guarded.attempts() == []


def test_a_10_mb_chunked_upload_is_cut_off_at_the_limit(guarded: Guarded) -> None:
    head = (
        b"POST /dry-run HTTP/1.1\r\nHost: service\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    piece = b" " * 65536
    chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
    answer = raw_exchange(guarded.server.port, head, iter([chunk] * 160))  # 10 MiB
    assert answer.status == 413, answer.body
    assert answer.body["error"] == "body_too_large"
    assert answer.seconds < ANSWER_WITHIN_S
    assert answer.headers["connection"] == "close" and answer.closed


def test_memory_stays_bounded_under_hostile_input(guarded: Guarded) -> None:
    """Server RSS before and after three rounds of every case: growth under 5%."""
    server = guarded.server
    for case in CASES.values():  # warm-up: first-use imports and caches
        _send(server, case)
    before = server.rss_bytes()
    for _ in range(3):
        for case in CASES.values():
            _send(server, case)
    after = server.rss_bytes()
    assert after < before * 1.05, f"RSS {before / 2**20:.1f} -> {after / 2**20:.1f} MiB"


def test_the_guard_covered_the_service_and_saw_no_attempt(guarded: Guarded) -> None:
    """The server and its forkserver loaded the guard (workers are forks of the latter)."""
    server = guarded.server
    forkservers = [
        p.pid for p in forkserver_processes(server.started_at()) if p.ppid() == server.process.pid
    ]
    assert forkservers, "no forkserver found"
    assert {server.process.pid, *forkservers} <= guarded.guarded_pids()
    assert guarded.attempts() == []


def test_the_guard_refuses_and_records_what_leaves_loopback(tmp_path: Path) -> None:
    """The guard itself, in a fresh interpreter: a test of the test."""
    net_log = tmp_path / "netguard.log"
    code = """
import socket
for attempt in (
    lambda: socket.socket().connect(("192.0.2.1", 80)),
    lambda: socket.getaddrinfo("huggingface.co", 443),
    lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).sendto(b"x", ("2001:db8::1", 53)),
):
    try:
        attempt()
    except PermissionError as exc:
        print("refused", exc)
try:
    socket.create_connection(("127.0.0.1", 9), timeout=1)
except ConnectionRefusedError:
    print("loopback allowed")
"""
    env = {**os.environ, "PYTHONPATH": str(NETGUARD), "NETGUARD_LOG": str(net_log)}
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.count("refused netguard:") == 3, result.stdout + result.stderr
    assert "loopback allowed" in result.stdout
    events = [json.loads(line)["event"] for line in net_log.read_text().splitlines()]
    assert events == ["socket.connect", "socket.getaddrinfo", "socket.sendto"]
