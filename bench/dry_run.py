"""Dry runs on the meta device: cold and repeated, next to a bare from_config + hooks.

Run: ``.venv/bin/python -m bench.dry_run`` (``--cold-runs`` fresh processes per
figure, 3; ``--presets``; ``--seq-lens`` for the measurement table).

1. Library, per preset.  A COLD figure is the first call in a fresh process
   that has already imported torch and transformers (that import is the same
   for both sides, timed once and left out).  ``bare``: what a dry run
   cannot do without - ``AutoConfig.for_model`` on the preset's config,
   ``AutoModelForCausalLM.from_config`` under ``torch.device("meta")`` and
   HF's own full checkpointing (``activation_checkpointing_enable()``,
   non-reentrant).  ``dry_run``: ``ckpt_core.dry_run(preset, "full")`` -
   config validation and bounds, the plan, the meta build, our hooks, the
   report.  WARM is the median of 5 more calls in the same process (no cache
   in the library: every call builds again).
2. Service: ``POST /dry-run`` to ``python -m service``: the first request
   (a cache miss, built by a warm worker), then 30 identical ones (cache
   hits), timed over loopback HTTP with a keep-alive connection.
3. The meta measurement (``measure_activation_bytes``, forward with labels)
   per preset, sequence length and tier, on a model built once: median of 3.

Medians everywhere; this machine is shared.
"""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from bench._common import (
    bench_env,
    free_port,
    median,
    percentile,
    spawn_service,
    stop,
    table,
    wait_for_status,
)

PRESETS = ("llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b", "qwen3-30b-a3b")
WARM_REPEATS = 5
SERVICE_REPEATS = 30
GIB = 1 << 30


# --- part 1: a fresh process per cold figure ------------------------------------


def _bare(preset: str) -> Callable[[], object]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ckpt_core import load_preset

    def build() -> object:
        config = load_preset(preset)
        hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_config)
        model.activation_checkpointing_enable()  # non-reentrant by default
        return model

    return build


def _dry_run(preset: str) -> Callable[[], object]:
    from ckpt_core import dry_run

    return lambda: dry_run({"preset": preset}, "full")


def child(kind: str, preset: str) -> None:
    """In a fresh process: import, then one cold call and `WARM_REPEATS` warm ones (JSON out)."""
    started = time.perf_counter()
    import torch  # noqa: F401 - the import both sides share, timed apart
    import transformers.modeling_utils  # noqa: F401

    import_s = time.perf_counter() - started
    call = (_bare if kind == "bare" else _dry_run)(preset)
    times = []
    for _ in range(1 + WARM_REPEATS):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    print(json.dumps({"import_s": import_s, "cold_ms": times[0], "warm_ms": median(times[1:])}))


def _run_child(kind: str, preset: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", kind, preset],
        capture_output=True,
        text=True,
        check=False,
        env=bench_env(),
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{kind} {preset} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def library_table(presets: list[str], cold_runs: int) -> tuple[str, float, dict[str, float]]:
    """Rows per preset; the import time; and cold ratio dry_run / bare per preset."""
    rows, ratios, imports = [], {}, []
    for preset in presets:
        runs: dict[str, list[dict[str, float]]] = {"bare": [], "dry_run": []}
        for _ in range(cold_runs):  # alternate: drift on the machine hits both alike
            for kind, results in runs.items():
                results.append(_run_child(kind, preset))
        cold = {k: median([r["cold_ms"] for r in v]) for k, v in runs.items()}
        warm = {k: median([r["warm_ms"] for r in v]) for k, v in runs.items()}
        imports += [r["import_s"] for v in runs.values() for r in v]
        ratios[preset] = cold["dry_run"] / cold["bare"]
        rows.append(
            [
                preset,
                cold["bare"],
                cold["dry_run"],
                ratios[preset],
                warm["bare"],
                warm["dry_run"],
                warm["dry_run"] / warm["bare"],
            ]
        )
        print(f"  {preset}: done", flush=True)
    headers = [
        "preset",
        "cold bare ms",
        "cold dry_run ms",
        "cold ratio",
        "warm bare ms",
        "warm dry_run ms",
        "warm ratio",
    ]
    return table(headers, rows), median(imports), ratios


# --- part 2: the service's cache ------------------------------------------------


def _post(connection: http.client.HTTPConnection, body: str) -> tuple[float, str]:
    started = time.perf_counter()
    connection.request("POST", "/dry-run", body=body, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    response.read()
    elapsed = (time.perf_counter() - started) * 1000
    if response.status != 200:
        raise RuntimeError(f"POST /dry-run answered {response.status}")
    return elapsed, response.headers.get("X-Cache", "")


def service_table(presets: list[str]) -> tuple[str, float]:
    """First (miss) and repeated (hit) POST /dry-run per preset; the worst hit p50."""
    port = free_port()
    with tempfile.TemporaryFile() as log:
        process = spawn_service(port, log)
        try:
            wait_for_status(f"http://127.0.0.1:{port}/readyz", process, 180)
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            rows, worst = [], 0.0
            for preset in presets:
                body = json.dumps({"model": {"preset": preset}, "tier": "full"})
                first, first_cache = _post(connection, body)
                hits = [_post(connection, body) for _ in range(SERVICE_REPEATS)]
                times = [ms for ms, _ in hits]
                assert first_cache == "miss" and {c for _, c in hits} == {"hit"}
                worst = max(worst, median(times))
                rows.append([preset, first, median(times), percentile(times, 99)])
            connection.close()
        finally:
            stop(process)
    headers = ["preset", "first (miss) ms", "repeat (hit) p50 ms", "repeat p99 ms"]
    return table(headers, rows), worst


# --- part 3: measurement ----------------------------------------------------------


def measure_table(presets: list[str], seq_lens: list[int]) -> str:
    from ckpt_core._configs.model_config import build_meta_model, load_model_config
    from ckpt_core._meta.measure import measure_activation_bytes

    rows = []
    for preset in presets:
        model = build_meta_model(load_model_config({"preset": preset}))
        measure_activation_bytes(model, "full", seq_len=128, micro_batch_size=1)  # first use
        for seq_len in seq_lens:
            for tier in ("off", "full"):
                times, kept = [], 0
                for _ in range(3):
                    started = time.perf_counter()
                    kept = measure_activation_bytes(
                        model, tier, seq_len=seq_len, micro_batch_size=1
                    )
                    times.append((time.perf_counter() - started) * 1000)
                rows.append([preset, seq_len, tier, median(times), kept / GIB])
        print(f"  {preset}: measured", flush=True)
    return table(["preset", "seq_len", "tier", "measure ms", "activations GiB"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold-runs", type=int, default=3, help="fresh processes per figure")
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--child", nargs=2, metavar=("KIND", "PRESET"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    print("1. library: cold (fresh process) and warm dry runs vs bare from_config + HF hooks")
    library, import_s, ratios = library_table(args.presets, args.cold_runs)
    print(f"\n{library}\n\n(torch + transformers import, excluded above: {import_s:.1f} s median)")
    print("\n2. service: POST /dry-run, first and repeated (cache)")
    service, worst_hit = service_table(args.presets)
    print(f"\n{service}")
    print("\n3. meta measurement time, batch 1, bf16, sdpa")
    print(f"\n{measure_table(args.presets, args.seq_lens)}")
    big = [p for p in args.presets if "70b" in p]
    print("\ntargets:")
    print(f"  repeated identical dry run (service cache hit, p50) < 5 ms: {worst_hit:.2f} ms worst")
    for preset in big:
        print(f"  cold {preset} dry run <= 1.5x bare from_config + hooks: {ratios[preset]:.2f}x")


if __name__ == "__main__":
    main()
