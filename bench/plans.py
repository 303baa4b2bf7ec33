"""auto's recompute cost: tier-only auto vs block-level auto vs the exhaustive optimum.

Run: ``.venv/bin/python -m bench.plans`` (every bundled preset x GPU memory
24 / 40 / 80 / 141 GiB x seq 2048 / 8192 / 32768 x method full / LoRA /
QLoRA), ``--quick`` (a few presets) or ``--presets P ...``.  ``--cells`` prints
every cell; ``--jobs N`` runs N presets at a time, each in a process of its own
(cold and warm times are then measured with N processes sharing the machine).

Per cell, with the same memory model (`tier_memory`) and FLOPs model:

- tier-only: the auto of the fixed order (off < selective < medium < full,
  the first tier whose peak fits);
- auto: `search.cheapest_fit`, what `make_plan` answers when a plan clears the
  estimate's error band (`search.auto_pick`);
- optimum: every count of off / selective / full blocks per kind of block
  (sliding or global attention, MoE or dense, encoder or decoder), the least
  recompute whose peak fits: judged as auto judges a plan, first by the search's
  model (`PeakModel.searching`: from the full tier's replay), then by the
  replay of its own placement.

"Fits" is auto's rule for all three: the peak within ``gpu_memory x (1 -
headroom) / (1 + band)``, the budget with the estimate's error band to spare.

Prints per preset and overall: cells with a feasible plan, the compute saved
by auto against tier-only (``1 - auto / tier-only`` of the step's FLOPs),
auto's largest gap to the optimum, and the time of ``make_plan("auto", ...)``
with a model: the first call for the cell's model and workload with the
allocator replay's, the peaks' and the alternatives' caches emptied (cold: what
a new request costs), and the best of ``--repeat`` further calls (warm: the replays and peaks
cached, the search and the rest), the least disturbed by other load on the
machine.
Cells whose sequence exceeds a model's learned positions are skipped.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import statistics
import time
from dataclasses import dataclass

GPUS = (24.0, 40.0, 80.0, 141.0)
SEQS = (2048, 8192, 32768)
METHODS = ("full", "lora", "qlora")
ORDER = ("off", "selective", "medium", "full")
QUICK = ("llama-3.2-1b", "llama-3.1-8b", "gemma-2-9b", "qwen3-30b-a3b", "t5-base")


@dataclass
class Cell:
    preset: str
    gib: float
    seq: int
    method: str
    tier_only: float | None = None
    auto: float | None = None
    auto_name: str = ""
    optimum: float | None = None
    plans: int = 0
    cold_ms: float = 0.0
    make_plan_ms: float = 0.0  # warm

    @property
    def saved(self) -> float | None:
        if self.tier_only is None or self.auto is None:
            return None
        return 1 - self.auto / self.tier_only

    @property
    def gap(self) -> float | None:
        if self.auto is None or self.optimum is None:
            return None
        return self.auto / self.optimum - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few presets")
    parser.add_argument("--presets", nargs="+", metavar="PRESET", help="these presets only")
    parser.add_argument("--cells", action="store_true", help="print every cell")
    parser.add_argument("--repeat", type=int, default=7, help="make_plan calls timed per cell")
    parser.add_argument(
        "--jobs", type=int, default=1, help="presets run at a time, one process each"
    )
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")

    from ckpt_core._configs.presets import preset_names

    presets = tuple(args.presets or (QUICK if args.quick else preset_names()))
    cells: list[Cell] = []
    with concurrent.futures.ProcessPoolExecutor(args.jobs, initializer=_warm_up) as pool:
        # Results in the presets' order, each printed once its preset is done.
        for done in pool.map(_preset_cells, presets, itertools.repeat(args.repeat)):
            cells.extend(done)
            if args.cells:
                for cell in done:
                    print(_cell_line(cell), flush=True)
    _summary(presets, cells)


def _warm_up() -> None:
    """One call with a model before any cell, so no cell's cold time counts the imports."""
    from ckpt_core import make_plan

    make_plan("auto", 80.0, model={"preset": "qwen2.5-0.5b"}, workload={"seq_len": 512})


def _preset_cells(preset: str, repeat: int) -> list[Cell]:
    """Every cell of one preset's grid (those within its learned positions)."""
    cells = (
        _cell(preset, gib, seq, method, repeat)
        for gib, seq, method in itertools.product(GPUS, SEQS, METHODS)
    )
    return [cell for cell in cells if cell is not None]


def _cell(preset: str, gib: float, seq: int, method: str, repeat: int) -> Cell | None:
    from ckpt_core import make_plan
    from ckpt_core._errors import InvalidWorkloadError
    from ckpt_core._memory.advise import _nearest_fitting
    from ckpt_core._memory.inputs import model_facts, parse_workload, prepare
    from ckpt_core._memory.peak_model import tier_memory
    from ckpt_core._memory.search import cheapest_fit, tier_candidates
    from ckpt_core._memory.step_trace import simulate
    from ckpt_core._memory.verdict import tight_band

    workload = {"seq_len": seq, "method": method}
    try:
        run = prepare(model_facts({"preset": preset}), parse_workload(workload))
    except InvalidWorkloadError:
        return None  # beyond the model's learned positions
    model = {"preset": preset}
    simulate.cache_clear()
    tier_memory.cache_clear()
    _nearest_fitting.cache_clear()
    started = time.perf_counter()
    make_plan("auto", gib, model=model, workload=workload)
    cold_ms = (time.perf_counter() - started) * 1000
    arch, step, static = run.facts.arch, run.step, run.peak
    usable = gib * (1 << 30) * (1 - run.workload.headroom)
    budget = int(usable / (1 + tight_band(arch, step)))
    cell = Cell(preset, gib, seq, method, cold_ms=cold_ms)
    tiers = tier_candidates(arch, step, static)
    fitting = [tiers[t] for t in ORDER if tiers[t].memory.peak_bytes <= budget]
    cell.tier_only = fitting[0].ratio if fitting else None
    best = cheapest_fit(arch, step, static, budget, tiers)
    if best is not None:
        cell.auto, cell.auto_name = best.ratio, best.tier or "blocks"
    cell.optimum, cell.plans = exhaustive_optimum(arch, step, static, budget)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        make_plan("auto", gib, model=model, workload=workload)
        times.append(time.perf_counter() - started)
    cell.make_plan_ms = min(times) * 1000  # the best of `repeat`: the least disturbed by load
    return cell


def exhaustive_optimum(
    arch: object, step: object, static: object, budget: int
) -> tuple[float | None, int]:
    """The least recompute over every count of off / selective / full per kind that fits
    by the search's model and by its own replay: plans in order of recompute, the first
    that fits (each replay is costly, so only the search's fits are replayed)."""
    from ckpt_core._memory.activations import block_kinds
    from ckpt_core._memory.flops import recompute_ratio

    kinds = block_kinds(arch)  # type: ignore[arg-type]
    per_kind = [
        [(kind, full, selective) for full in range(n + 1) for selective in range(n - full + 1)]
        for kind, n in kinds
    ]
    sizes = dict(kinds)
    ranked = []
    for choice in itertools.product(*per_kind):
        counts = tuple(
            item
            for kind, full, selective in choice
            for item in (
                (("full", kind), full),
                (("selective", kind), selective),
                (("off", kind), sizes[kind] - full - selective),
            )
        )
        ranked.append((recompute_ratio(arch, step, counts), counts))  # type: ignore[arg-type]
    ranked.sort(key=lambda item: item[0])
    searching = static.searching()  # type: ignore[attr-defined]
    for ratio, counts in ranked:
        if searching.of(arch, step, counts).peak_bytes > budget:
            continue
        if static.of(arch, step, counts).peak_bytes <= budget:  # type: ignore[attr-defined]
            return ratio, len(ranked)
    return None, len(ranked)


def _cell_line(cell: Cell) -> str:
    def fmt(value: float | None) -> str:
        return "   -  " if value is None else f"{value:.4f}"

    saved = "" if cell.saved is None else f"{cell.saved:+.2%}"
    gap = "" if cell.gap is None else f"{cell.gap:.3%}"
    return (
        f"{cell.preset:18} {cell.gib:5.0f} {cell.seq:6d} {cell.method:6} "
        f"{fmt(cell.tier_only)} {fmt(cell.auto)} {cell.auto_name:9} {fmt(cell.optimum)} "
        f"{saved:>8} {gap:>7} {cell.cold_ms:8.1f} / {cell.make_plan_ms:6.2f} ms"
    )


def _summary(presets: tuple[str, ...], cells: list[Cell]) -> None:
    print(
        "\n| preset | cells | feasible | auto = block-level | mean saved | largest saved "
        "| worst gap to optimum | make_plan cold ms (mean / max) "
        "| make_plan warm ms (mean / max) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for preset in (*presets, "all"):
        group = [c for c in cells if preset in ("all", c.preset)]
        if group:
            print(_row(preset, group))
    infeasible_tiers = [c for c in cells if c.tier_only is None and c.auto is not None]
    missed = [c for c in cells if (c.auto is None) != (c.optimum is None)]
    print(f"\ncells where only a block-level plan fits: {len(infeasible_tiers)}")
    print(f"cells where auto and the optimum disagree on feasibility: {len(missed)}")
    for warmth in ("cold", "warm"):
        for label, fitting in (("a plan fits", True), ("nothing fits", False)):
            times = [
                c.cold_ms if warmth == "cold" else c.make_plan_ms
                for c in cells
                if (c.auto is not None) == fitting
            ]
            if times:
                print(
                    f"make_plan with a model, {warmth}, {label}: mean "
                    f"{statistics.fmean(times):.2f} ms, median {statistics.median(times):.2f} ms, "
                    f"max {max(times):.2f} ms ({len(times)} cells)"
                )
    worst = max((c for c in cells if c.gap is not None), key=lambda c: c.gap, default=None)
    if worst is not None:
        print(f"worst gap: {_cell_line(worst)}")
    best = max((c for c in cells if c.saved is not None), key=lambda c: c.saved, default=None)
    if best is not None:
        print(f"largest saving: {_cell_line(best)}")


def _row(name: str, group: list[Cell]) -> str:
    feasible = [c for c in group if c.optimum is not None]
    saved = [c.saved for c in group if c.saved is not None]
    gaps = [c.gap for c in group if c.gap is not None]
    blocks = sum(c.auto_name == "blocks" for c in group)
    cold = [c.cold_ms for c in group]
    times = [c.make_plan_ms for c in group]
    mean_saved = f"{statistics.fmean(saved):.2%}" if saved else "-"
    max_saved = f"{max(saved):.2%}" if saved else "-"
    gap = f"{max(gaps):.3%}" if gaps else "-"
    return (
        f"| {name} | {len(group)} | {len(feasible)} | {blocks} | {mean_saved} | {max_saved} "
        f"| {gap} | {statistics.fmean(cold):.1f} / {max(cold):.1f} "
        f"| {statistics.fmean(times):.2f} / {max(times):.2f} |"
    )


if __name__ == "__main__":
    main()
