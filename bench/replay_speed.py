"""How long `make_plan` with a model takes, cold and warm, against the branch's start.

Run: ``.venv/bin/python -m bench.replay_speed [--repeat N] [--warm N]`` prints, per
case, the first call with that model in a fresh process (imports already done
by a call with another model: what remains is the allocator replay and the
search) and the median of ``--warm`` further calls, each the median over
``--repeat`` processes, next to the figures measured at the start of the
``replay-speed`` branch (`BASELINE`, docs/performance.md) as ratios.

``--dump`` instead prints every answer of a grid of calls (`GRID`) as JSON, one
line per call: the same output before and after a change means the same
peaks, verdicts, chosen plans and alternatives.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any, Final

from bench._common import ROOT, bench_env

# name -> (gpu, preset, workload)
CASES: Final[dict[str, tuple[str, str, dict[str, Any]]]] = {
    "8b LoRA s8192 A100-80GB": ("A100-80GB", "llama-3.1-8b", {"seq_len": 8192, "method": "lora"}),
    "70b full s8192 A100-80GB (nothing fits)": (
        "A100-80GB",
        "llama-3.1-70b",
        {"seq_len": 8192, "method": "full"},
    ),
    "8b QLoRA s8192 RTX 4090 (nothing fits)": (
        "RTX 4090",
        "llama-3.1-8b",
        {"seq_len": 8192, "method": "qlora"},
    ),
    "8b QLoRA s4096 A100-40GB": ("A100-40GB", "llama-3.1-8b", {"seq_len": 4096, "method": "qlora"}),
}
# Measured at 31d67f0 (the branch's start) with this script, --repeat 5 --warm 20, on the
# 2-CPU development machine shared with other jobs, 2026-12-03: (cold ms, warm ms), each a
# median; docs/performance.md has them with the breakdown.
BASELINE: Final[dict[str, tuple[float, float]]] = {
    "8b LoRA s8192 A100-80GB": (128.3, 2.14),
    "70b full s8192 A100-80GB (nothing fits)": (1228.6, 6.59),
    "8b QLoRA s8192 RTX 4090 (nothing fits)": (578.1, 3.36),
    "8b QLoRA s4096 A100-40GB": (131.5, 1.87),
}
WARMUP: Final = ("A100-80GB", "qwen2.5-0.5b", {"seq_len": 512})

GRID: Final[tuple[tuple[str, str, str, dict[str, Any]], ...]] = (
    *((("auto", gpu, preset, load) for gpu, preset, load in CASES.values())),
    ("auto", "H200", "llama-3.2-1b", {"seq_len": 32768, "method": "lora"}),
    ("auto", "A100-40GB", "llama-3.1-8b", {"seq_len": 4096, "method": "lora"}),
    ("auto", "RTX 4090", "llama-3.1-8b", {"seq_len": 8192, "method": "full"}),
    ("auto", "RTX 4090", "qwen2.5-1.5b", {"seq_len": 4096, "micro_batch_size": 4}),
    ("auto", "A100-40GB", "gemma-2-9b", {"seq_len": 8192, "method": "qlora"}),
    ("auto", "A100-80GB", "qwen3-30b-a3b", {"seq_len": 4096, "method": "lora"}),
    ("auto", "RTX 4090", "mixtral-8x7b", {"seq_len": 4096, "method": "qlora"}),
    ("auto", "A100-40GB", "t5-base", {"seq_len": 512, "method": "full"}),
    ("auto", "RTX 4090", "gpt2", {"seq_len": 1024, "attention": "eager", "micro_batch_size": 6}),
    ("auto", "A100-40GB", "phi-3-mini", {"seq_len": 4096, "gradients": "accumulate"}),
    (
        "auto",
        "RTX 4090",
        "llama-3.2-3b",
        {"seq_len": 2048, "method": "qlora", "attention": "eager"},
    ),
    ("selective", "A100-80GB", "llama-3.1-8b", {"seq_len": 8192, "method": "lora"}),
    ("off", "A100-80GB", "qwen2.5-7b", {"seq_len": 2048, "method": "full"}),
)


def _call(tier: str, gpu: str, preset: str, workload: dict[str, Any]) -> Any:
    from ckpt_core import make_plan

    return make_plan(tier, gpu=gpu, model={"preset": preset}, workload=workload)


def _child(name: str, warm: int) -> None:
    """One process: warm the imports, time the first call with the case's model, then more."""
    _call("auto", *WARMUP)
    gpu, preset, workload = CASES[name]
    started = time.perf_counter()
    _call("auto", gpu, preset, workload)
    cold = time.perf_counter() - started
    times = []
    for _ in range(warm):
        started = time.perf_counter()
        _call("auto", gpu, preset, workload)
        times.append(time.perf_counter() - started)
    print(json.dumps({"cold": cold * 1000, "warm": statistics.median(times) * 1000}))


def _measure(name: str, repeat: int, warm: int) -> tuple[float, float]:
    colds, warms = [], []
    for _ in range(repeat):
        out = subprocess.run(
            [sys.executable, "-m", "bench.replay_speed", "--child", name, "--warm", str(warm)],
            cwd=ROOT,
            env=bench_env(),
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        figures = json.loads(out.splitlines()[-1])
        colds.append(figures["cold"])
        warms.append(figures["warm"])
    return statistics.median(colds), statistics.median(warms)


def _dump() -> None:
    for tier, gpu, preset, workload in GRID:
        plan = _call(tier, gpu, preset, workload)
        answer = {
            "call": [tier, gpu, preset, workload],
            "granularity": plan.granularity,
            "reason": plan.reason,
            "block_plan": repr(plan.block_plan),
            "estimate": plan.estimate,
        }
        print(json.dumps(answer, sort_keys=True, default=repr), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="fresh processes per case")
    parser.add_argument("--warm", type=int, default=20, help="warm calls timed per process")
    parser.add_argument("--dump", action="store_true", help="print the grid's answers as JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.warm)
        return
    if args.dump:
        _dump()
        return
    print(
        f"{'case':42} {'cold ms':>9} {'start':>9} {'ratio':>7} "
        f"{'warm ms':>8} {'start':>8} {'ratio':>7}"
    )
    for name in CASES:
        cold, warm = _measure(name, args.repeat, args.warm)
        base_cold, base_warm = BASELINE.get(name, (float("nan"), float("nan")))
        print(
            f"{name:42} {cold:9.1f} {base_cold:9.1f} {base_cold / cold:6.1f}x "
            f"{warm:8.2f} {base_warm:8.2f} {base_warm / warm:6.1f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
