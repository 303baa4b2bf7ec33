"""Shared pieces of the bench scripts: ports, readiness polls, statistics, tables.

Scripts run as modules from the repository root, ``.venv/bin/python -m
bench.NAME``, so they import the project and this module as ``bench._common``.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Final

ROOT = Path(__file__).resolve().parents[1]
# LoRA on the attention: Llama's linears, and those of model types that name them otherwise.
TARGETS: Final = ("q_proj", "k_proj", "v_proj", "o_proj")
TARGETS_BY_TYPE: Final[dict[str, tuple[str, ...]]] = {
    "phi3": ("qkv_proj", "o_proj"),  # fused q / k / v
    "t5": ("q", "k", "v", "o"),  # self- and cross-attention
    "phi": ("q_proj", "k_proj", "v_proj", "dense"),
    "gpt_neox": ("query_key_value", "dense"),
    "opt": ("q_proj", "k_proj", "v_proj", "out_proj"),
    "deepseek_v2": ("q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"),  # latent attention
    "deepseek_v3": ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"),
    "falcon": ("query_key_value", "dense"),
    "gpt2": ("c_attn", "attn.c_proj"),
    "bert": ("query", "key", "value", "attention.output.dense"),
}


def attention_targets(model_type: str) -> list[str]:
    """The LoRA targets that adapt a model type's attention projections."""
    return list(TARGETS_BY_TYPE.get(model_type, TARGETS))


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bench_env(**extra: str) -> dict[str, str]:
    """The environment of a child process: offline, plus `extra`."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", **extra}


def spawn_service(port: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
    """``python -m service`` on loopback `port` (production settings), output to `log`."""
    return subprocess.Popen(
        [sys.executable, "-m", "service"],
        cwd=ROOT,
        env=bench_env(CKPT_PORT=str(port)),
        stdout=log,
        stderr=log,
    )


def http_status(url: str, timeout_s: float = 2.0) -> int | None:
    """Status of a GET on `url`, or None when nothing answers."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def wait_for_status(
    url: str, process: subprocess.Popen[bytes], timeout_s: float, poll_s: float = 0.02
) -> float:
    """Seconds until `url` answers 200; raise if `process` exits or time runs out."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before {url} was 200")
        if http_status(url, timeout_s=poll_s * 50) == 200:
            return time.perf_counter() - start
        time.sleep(poll_s)
    raise TimeoutError(f"{url} not 200 within {timeout_s:g} s")


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 20 s (the service's graceful shutdown)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0-100) by nearest rank; `values` need not be sorted."""
    ordered = sorted(values)
    rank = max(1, round(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (pastes into the README as is) with right-aligned numbers."""
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(headers)]
    numeric = [all(_is_number(row[i]) for row in rows) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        padded = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|"
        + "|".join(
            ("-" * (w + 1) + ":") if n else "-" * (w + 2)
            for w, n in zip(widths, numeric, strict=True)
        )
        + "|"
    )
    return "\n".join([line(list(headers)), rule, *(line(row) for row in cells)])


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)
