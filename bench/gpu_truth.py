"""The memory estimate against real GPU training steps.

Run: ``.venv/bin/python -m bench.gpu_truth [--shared DIR] [--local DIR] [--budget-mib N]``.
Scores every row under ``--shared`` (default ``../shared/data/gpu-steps`` from
the repository root) and ``--local`` (default ``bench/data``, rows recorded by
``bench/gpu_step.py``), repeats dropped: a table per row, a summary by group
(GPU x QLoRA / LoRA x eager / SDPA, and by tier) of the error of
``allocated_bytes`` against ``torch.cuda.max_memory_allocated()`` and of
``peak_bytes`` against process memory (reserved + CUDA context), and boundary
verdicts: each row against budgets just above and just below its real process memory (and against
``--budget-mib``), counting answers "fits" for a step that would not
(dangerous), "tight", and "does_not_fit" for one that would (over-cautious).
Rows that recorded their pool (``measured.segments_mib``) also get their large
segments next to those the estimate's replay reserves.
Exits 1 when a target of issue 15 is missed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bench._gpu_rows import (
    LOCAL_ROWS,
    MIB,
    SHARED_ROWS,
    estimate_row,
    gpu_of,
    load_rows,
    replayed_segments,
    tier_of,
)

# Budgets relative to a row's real process memory for the boundary verdicts.
OFFSETS: Final = (-0.10, -0.05, -0.02, 0.02, 0.05, 0.10)
TARGETS: Final = {"process_worst": 8.0, "process_mean": 3.0, "allocated_worst": 5.0}


@dataclass(frozen=True, slots=True)
class Score:
    """One row: measured and estimated allocated peak and process memory (MiB), errors in %."""

    label: str
    group: str
    tier: str
    measured_allocated: float
    estimated_allocated: float
    measured_process: float
    estimated_process: float

    @property
    def allocated_error(self) -> float:
        return 100 * (self.estimated_allocated - self.measured_allocated) / self.measured_allocated

    @property
    def process_error(self) -> float:
        return 100 * (self.estimated_process - self.measured_process) / self.measured_process


def group_of(row: dict[str, Any]) -> str:
    run = row["run"]
    method = "QLoRA" if run.get("quantization", "none") not in ("none", None) else "LoRA"
    if run.get("method") == "full":
        method = "full"
    kernel = "eager" if run["kernel"] == "eager" else "SDPA"
    return f"{gpu_of(row) or 'unknown GPU'} {method} {kernel}"


def label_of(row: dict[str, Any]) -> str:
    run = row["run"]
    return (
        f"{row['model_config']['name'][:22]} bs{run['batch_size']} s{run['seq_len']} {tier_of(row)}"
    )


def score(rows: Iterable[dict[str, Any]]) -> list[Score]:
    scores = []
    for row in rows:
        estimate = estimate_row(row)
        measured = row["measured"]
        scores.append(
            Score(
                label_of(row),
                group_of(row),
                tier_of(row),
                measured["peak_allocated_mib"],
                estimate["allocated_bytes"] / MIB,
                measured["process_mib"],
                estimate["peak_bytes"] / MIB,
            )
        )
    return scores


def summary(scores: list[Score], by: str = "group") -> dict[str, dict[str, float]]:
    """Per group (``by``: "group" or "tier") and for all rows: rows, mean |error| and worst
    (signed) error, in %."""
    groups: dict[str, list[Score]] = {}
    for item in scores:
        groups.setdefault(getattr(item, by), []).append(item)
    groups["all"] = list(scores)
    result = {}
    for name, items in sorted(groups.items()):
        allocated = [item.allocated_error for item in items]
        process = [item.process_error for item in items]
        result[name] = {
            "rows": len(items),
            "allocated_mean": sum(map(abs, allocated)) / len(items),
            "allocated_worst": max(allocated, key=abs),
            "process_mean": sum(map(abs, process)) / len(items),
            "process_worst": max(process, key=abs),
        }
    return result


def boundary(rows: Iterable[dict[str, Any]], budget_mib: float | None) -> dict[str, int]:
    """Verdicts against budgets around each row's real process memory (and a fixed one)."""
    counts = {"cases": 0, "dangerous": 0, "tight": 0, "over_cautious": 0, "right": 0}
    for row in rows:
        real = row["measured"]["process_mib"]
        budgets = [real * (1 + offset) for offset in OFFSETS]
        if budget_mib is not None:
            budgets.append(budget_mib)
        for budget in budgets:
            verdict = estimate_row(row, int(budget * MIB))["verdict"]
            counts["cases"] += 1
            fits = real <= budget
            if verdict == "tight":
                counts["tight"] += 1
            elif verdict == "fits" and not fits:
                counts["dangerous"] += 1
            elif verdict == "does_not_fit" and fits:
                counts["over_cautious"] += 1
            else:
                counts["right"] += 1
    return counts


def missed_targets(table: dict[str, dict[str, float]], verdicts: dict[str, int]) -> list[str]:
    total = table["all"]
    missed = [
        f"{name} {abs(total[name]):.2f}% > {limit}%"
        for name, limit in TARGETS.items()
        if abs(total[name]) > limit
    ]
    if verdicts["dangerous"]:
        missed.append(f"{verdicts['dangerous']} dangerous 'fits' verdicts")
    return missed


def print_report(scores: list[Score]) -> None:
    print(
        f"{'row':40} {'group':12} {'alloc MiB':>9} {'est':>8} {'err':>7} "
        f"{'process MiB':>11} {'est':>8} {'err':>7}"
    )
    for item in scores:
        print(
            f"{item.label:40} {item.group:12} {item.measured_allocated:9.0f} "
            f"{item.estimated_allocated:8.0f} {item.allocated_error:+6.1f}% "
            f"{item.measured_process:11.0f} {item.estimated_process:8.0f} "
            f"{item.process_error:+6.1f}%"
        )
    for by in ("group", "tier"):
        print(
            f"\n| {by} | rows | allocated mean abs | allocated worst | process mean abs | "
            "process worst |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for name, row in summary(scores, by).items():
            print(
                f"| {name} | {row['rows']} | {row['allocated_mean']:.2f}% | "
                f"{row['allocated_worst']:+.2f}% | {row['process_mean']:.2f}% | "
                f"{row['process_worst']:+.2f}% |"
            )


def segment_lines(rows: Iterable[dict[str, Any]]) -> list[str]:
    """Per row that recorded its pool: its large-pool segments and the replay's, in MiB,
    largest first (small-pool segments, 2 MiB each, left out)."""
    lines = []
    for row in rows:
        measured = row["measured"].get("segments_mib")
        if measured is None:
            continue
        replayed = [size / MIB for size in replayed_segments(row)]
        lines.append(
            f"{label_of(row)}: {len(measured)} segments measured, {len(replayed)} replayed"
        )
        for name, sizes in (("measured", measured), ("replayed", replayed)):
            large = sorted((size for size in sizes if size > 2), reverse=True)
            lines.append(f"  {name:9} {', '.join(f'{size:.0f}' for size in large)}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=SHARED_ROWS, help="shared rows folder")
    parser.add_argument("--local", type=Path, default=LOCAL_ROWS, help="this project's rows")
    parser.add_argument("--budget-mib", type=float, default=14000.0, help="a fixed budget")
    args = parser.parse_args()
    if not args.shared.is_dir():
        print(f"no shared rows at {args.shared} (pass --shared)", file=sys.stderr)
    rows = load_rows([args.shared, args.local])
    if not rows:
        print("no rows to score", file=sys.stderr)
        return 2
    scores = score(rows)
    table = summary(scores)
    print_report(scores)
    verdicts = boundary(rows, args.budget_mib)
    print(
        f"\nboundary verdicts ({len(rows)} rows x budgets at real process memory "
        f"{', '.join(f'{o:+.0%}' for o in OFFSETS)} and {args.budget_mib:.0f} MiB): {verdicts}"
    )
    segments = segment_lines(rows)
    if segments:
        print("\npool segments (MiB, large pool, largest first):\n" + "\n".join(segments))
    missed = missed_targets(table, verdicts)
    print("targets: " + ("all met" if not missed else "MISSED: " + "; ".join(missed)))
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
