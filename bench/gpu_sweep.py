"""Issue 15's device check: every tier on three families at two lengths, one process per step.

Run on a CUDA machine: ``.venv/bin/python -m bench.gpu_sweep [--out FILE] [--dry]``.
For each preset x sequence length x tier (off, selective, medium, full) it
runs ``bench/gpu_step.py`` in a fresh process (a clean CUDA context and
caching allocator per row, as the shared rows were measured), LoRA r32 on q /
k / v / o, bf16, sdpa, appending the rows to ``--out`` (default
``bench/data/sweep.json``), which ``bench/gpu_truth.py`` then scores.
``--dry`` prints the commands without running them.  A step that runs out of
memory or fails is reported and skipped; the exit status is the number of
failed steps (at most 125).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[1]
PRESETS: Final = ("llama-3.2-1b", "qwen2.5-1.5b", "gemma-3-1b")  # three families
SEQS: Final = (1024, 4096)
TIERS: Final = ("off", "selective", "medium", "full")


def commands(out: Path, presets: tuple[str, ...], seqs: tuple[int, ...]) -> list[list[str]]:
    return [
        [
            sys.executable,
            str(ROOT / "bench" / "gpu_step.py"),
            "--model",
            preset,
            "--seq-len",
            str(seq),
            "--tier",
            tier,
            "--dtype",
            "bf16",
            "--attention",
            "sdpa",
            "--out",
            str(out),
        ]
        for preset in presets
        for seq in seqs
        for tier in TIERS
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "data" / "sweep.json")
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--seqs", default=",".join(map(str, SEQS)))
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per step")
    parser.add_argument("--dry", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    seqs = tuple(int(seq) for seq in args.seqs.split(","))
    failed = 0
    for command in commands(args.out, tuple(args.presets.split(",")), seqs):
        print(" ".join(command[1:]), flush=True)
        if args.dry:
            continue
        try:
            done = subprocess.run(command, timeout=args.timeout, check=False)
        except subprocess.TimeoutExpired:
            print("  timed out", flush=True)
            failed += 1
            continue
        if done.returncode:
            print(f"  failed with status {done.returncode}", flush=True)
            failed += 1
    return min(failed, 125)


if __name__ == "__main__":
    raise SystemExit(main())
