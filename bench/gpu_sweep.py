"""Issue 15's device check: every tier on three families at two lengths, one process per step.

Run on a CUDA machine: ``.venv/bin/python -m bench.gpu_sweep [--out FILE] [--dry]``.
For each preset x sequence length x tier (off, selective, medium, full) it
runs ``bench.gpu_step`` in a fresh process (a clean CUDA context and
caching allocator per row, as the shared rows were measured), LoRA r32 on the
attention's projections, bf16, sdpa (``--attention eager``, ``--tiers`` for others;
``--padded``: an attention mask that pads each row's last token; ``--method full``,
``--method qlora --quantization nf4|int8`` and ``--load-path to_device`` for other
recipes; ``--presets t5-base,bert-base-uncased`` for the encoder families;
``--tiers blocks:8`` for a block-level plan of 8 whole blocks),
appending the rows to ``--out`` (default ``bench/data/sweep.json``), which
``bench/gpu_truth.py`` then scores.  Each model's random weights are built
once and reused by its later steps.
``--dry`` prints the commands without running them.  A step that runs out of
memory or fails is reported and skipped; the exit status is the number of
failed steps (at most 125).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[1]
PRESETS: Final = ("llama-3.2-1b", "qwen2.5-1.5b", "gemma-3-1b")  # three families
SEQS: Final = (2048, 8192)
TIERS: Final = ("off", "selective", "medium", "full")


def commands(
    out: Path,
    presets: tuple[str, ...],
    seqs: tuple[int, ...],
    weights: Path,
    *,
    tiers: tuple[str, ...] = TIERS,
    attention: str = "sdpa",
    padded: bool = False,
    recipe: tuple[str, ...] = (),
) -> list[list[str]]:
    """One ``bench.gpu_step`` command per preset x length x tier; ``recipe``: more of its
    arguments (``--method qlora --quantization int8``, ``--load-path to_device``)."""
    return [
        [
            sys.executable,
            "-m",
            "bench.gpu_step",
            "--model",
            preset,
            "--seq-len",
            str(seq),
            "--tier",
            tier,
            "--dtype",
            "bf16",
            "--attention",
            attention,
            "--out",
            str(out),
            "--weights",
            str(weights / preset),
            *recipe,
            *(["--padded"] if padded else []),
        ]
        for preset in presets
        for seq in seqs
        for tier in tiers
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "data" / "sweep.json")
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--seqs", default=",".join(map(str, SEQS)))
    parser.add_argument("--tiers", default=",".join(TIERS))
    parser.add_argument("--attention", choices=("sdpa", "eager"), default="sdpa")
    parser.add_argument("--padded", action="store_true", help="padded batches (gpu_step's)")
    parser.add_argument("--method", choices=("full", "lora", "qlora"), default="lora")
    parser.add_argument("--quantization", choices=("nf4", "int8"), default="nf4")
    parser.add_argument("--load-path", choices=("device_map", "to_device"), default="device_map")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per step")
    parser.add_argument("--dry", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    seqs = tuple(int(seq) for seq in args.seqs.split(","))
    with tempfile.TemporaryDirectory() as weights:
        presets, tiers = tuple(args.presets.split(",")), tuple(args.tiers.split(","))
        steps = commands(
            args.out,
            presets,
            seqs,
            Path(weights),
            tiers=tiers,
            attention=args.attention,
            padded=args.padded,
            recipe=_recipe(args),
        )
        failed = sum(_run(step, args.timeout, args.dry) for step in steps)
    return min(failed, 125)


def _recipe(args: argparse.Namespace) -> tuple[str, ...]:
    """The gpu_step arguments for a recipe other than the default (LoRA, a device map)."""
    recipe: list[str] = []
    if args.method == "qlora":
        recipe += ["--method", "qlora", "--quantization", args.quantization]
    elif args.method == "full":
        recipe += ["--method", "full"]
    if args.load_path != "device_map":
        recipe += ["--load-path", args.load_path]
    return tuple(recipe)


def _run(command: list[str], timeout: float, dry: bool) -> bool:
    """Runs one step from the repository root; True when it failed."""
    print(" ".join(command[2:]), flush=True)
    if dry:
        return False
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        print("  timed out", flush=True)
        return True
    print(f"  status {done.returncode} in {time.perf_counter() - started:.1f} s", flush=True)
    return done.returncode != 0


if __name__ == "__main__":
    raise SystemExit(main())
