"""Import and start-up times: ``import ckpt_core`` (no torch) and the service's start to ready.

Run: ``.venv/bin/python -m bench.import`` (``--runs`` 9 for the imports,
``--starts`` 3 for the service).

1. ``python -X importtime -c "import ckpt_core"`` in fresh interpreters: the
   cumulative time of the ``ckpt_core`` line (what the import itself costs,
   interpreter start-up excluded), median over runs; each child also checks
   that torch, transformers, pydantic and fastapi were NOT loaded.  The same
   for ``import service.app`` (FastAPI, pydantic and ckpt_core), for scale.
2. ``python -m service`` spawned with production settings: seconds until
   ``/healthz`` answers 200 (the process serves) and until ``/readyz`` does
   (dry-run workers warm: torch and transformers imported in the forkserver,
   one tiny dry run done), polled every 20 ms; median over starts.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time

from bench._common import (
    ROOT,
    bench_env,
    free_port,
    median,
    spawn_service,
    stop,
    table,
    wait_for_status,
)

HEAVY = ("torch", "transformers", "pydantic", "fastapi")
_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)$")
READY_TIMEOUT_S = 180.0


def import_once(module: str, forbid: tuple[str, ...]) -> tuple[float, list[tuple[float, str]]]:
    """(cumulative ms of importing `module`, [(self ms, name)] of everything it imported)."""
    code = (
        f"import sys, {module}\n"
        f"loaded = [m for m in {forbid!r} if m in sys.modules]\n"
        "assert not loaded, f'loaded: {loaded}'\n"
    )
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env=bench_env(),
    )
    if done.returncode != 0:
        raise RuntimeError(f"import {module} failed: {done.stderr[-1500:]}")
    rows = [m.groups() for m in map(_LINE.match, done.stderr.splitlines()) if m]
    # importtime prints children before their parent: the parent's block starts
    # after the previous top-level (indent 1) line.
    end = next(i for i, r in enumerate(rows) if r[3] == module and len(r[2]) == 1)
    start = max((i for i, r in enumerate(rows[:end]) if len(r[2]) == 1), default=-1) + 1
    subtree = [(int(r[0]) / 1000, r[3]) for r in rows[start : end + 1]]
    return int(rows[end][1]) / 1000, subtree


def import_table(runs: int) -> tuple[str, float, str]:
    """Rows for ckpt_core and service.app; ckpt_core's median ms; its slowest modules."""
    rows, ckpt_ms, slowest = [], 0.0, ""
    for module, forbid in (("ckpt_core", HEAVY), ("service.app", ())):
        results = [import_once(module, forbid) for _ in range(runs)]
        times = sorted(ms for ms, _ in results)
        loaded = "none loaded" if forbid else "(loads fastapi, pydantic)"
        rows.append([f"import {module}", times[len(times) // 2], times[0], times[-1], loaded])
        if module == "ckpt_core":
            ckpt_ms = median(times)
            middle = sorted(results)[len(results) // 2][1]
            top = sorted(middle, reverse=True)[:6]
            slowest = ", ".join(f"{name} {ms:.1f}" for ms, name in top)
    headers = ["what", "median ms", "min ms", "max ms", "torch/transformers/pydantic/fastapi"]
    return table(headers, rows), ckpt_ms, slowest


def start_once() -> tuple[float, float]:
    """(seconds to /healthz 200, seconds to /readyz 200) of one ``python -m service``."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        started = time.perf_counter()
        process = spawn_service(port, log)
        try:
            wait_for_status(base + "/healthz", process, READY_TIMEOUT_S)
            healthy = time.perf_counter() - started
            wait_for_status(base + "/readyz", process, READY_TIMEOUT_S)
            return healthy, time.perf_counter() - started
        finally:
            stop(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--starts", type=int, default=3)
    args = parser.parse_args()
    imports, ckpt_ms, slowest = import_table(args.runs)
    print(f"1. imports ({args.runs} fresh interpreters each, python -X importtime)\n")
    print(imports)
    print(f"\nslowest in import ckpt_core (self ms, median run): {slowest}")
    starts = [start_once() for _ in range(args.starts)]
    print(f"\n2. python -m service, start to ready ({args.starts} starts)\n")
    rows = [
        ["/healthz 200", median([h for h, _ in starts]), min(h for h, _ in starts)],
        ["/readyz 200", median([r for _, r in starts]), min(r for _, r in starts)],
    ]
    print(table(["from spawn to", "median s", "min s"], rows))
    print(f"\ntarget: import ckpt_core <= 50 ms without torch: {ckpt_ms:.1f} ms")


if __name__ == "__main__":
    main()
