"""Closed-form activation estimate vs the meta-device measurement, with timings.

Run: ``.venv/bin/python -m bench.estimate`` (every bundled preset x seq 1k / 4k /
16k x the four tiers) or ``--quick`` (a few presets at 1k and 4k).  Prints, per
row, the measured and estimated activation bytes, the error, and how long the
estimate and the measurement took; then the worst error and, separately, the
time of a cold meta build + measurement of a 70B-class preset at seq 8192.

Sequence lengths beyond a model's learned positions (GPT-2: 1024, BERT: 512)
are skipped and said so.  Numbers are whatever this machine measures.
"""

from __future__ import annotations

import argparse
import time

GIB = 1 << 30
TIERS = ("off", "selective", "medium", "full")
QUICK = ("llama-3.2-1b", "qwen3-30b-a3b", "gemma-3-1b", "gpt2", "t5-base")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few presets at 1k and 4k")
    parser.add_argument(
        "--attention", default="sdpa", choices=("sdpa", "flash_attention_2", "eager")
    )
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()

    from ckpt_core._configs.presets import preset_names

    presets = QUICK if args.quick else tuple(preset_names())
    seqs = (1024, 4096) if args.quick else (1024, 4096, 16384)
    worst = (0.0, "")
    print(
        f"{'preset':18} {'seq':>6} {'tier':9} {'measured GiB':>12} {'estimate GiB':>12} "
        f"{'error':>8} {'est ms':>7} {'meas s':>7}"
    )
    for preset in presets:
        for row in _rows(preset, seqs, args):
            print(row.line(), flush=True)
            if row.error is not None and abs(row.error) > abs(worst[0]):
                worst = (row.error, f"{preset} seq {row.seq} {row.tier}")
    print(f"\nworst error: {worst[0]:+.3f}% ({worst[1]})")
    _time_70b(args)


class Row:
    """One (preset, seq, tier) comparison."""

    def __init__(self, preset: str, seq: int, tier: str) -> None:
        self.preset, self.seq, self.tier = preset, seq, tier
        self.measured = self.estimated = 0
        self.estimate_ms = self.measure_s = 0.0
        self.error: float | None = None
        self.note = ""

    def line(self) -> str:
        head = f"{self.preset:18} {self.seq:6d} {self.tier:9}"
        if self.note:
            return f"{head} {self.note}"
        return (
            f"{head} {self.measured / GIB:12.3f} {self.estimated / GIB:12.3f} "
            f"{self.error:+7.3f}% {self.estimate_ms:7.2f} {self.measure_s:7.2f}"
        )


def _rows(preset: str, seqs: tuple[int, ...], args: argparse.Namespace) -> list[Row]:
    from ckpt_core._configs.model_config import build_meta_model, load_model_config
    from ckpt_core._errors import InvalidWorkloadError
    from ckpt_core._memory.activations import activation_bytes
    from ckpt_core._memory.inputs import model_facts, parse_workload, prepare
    from ckpt_core._meta.measure import measure_activation_bytes

    config = load_model_config({"preset": preset})
    model = _build(build_meta_model, config, args.attention)
    rows = []
    for seq in seqs:
        workload = {
            "seq_len": seq,
            "micro_batch_size": args.batch,
            "dtype": args.dtype,
            "attention": args.attention,
        }
        for tier in TIERS:
            row = Row(preset, seq, tier)
            rows.append(row)
            try:
                start = time.perf_counter()
                run = prepare(model_facts({"preset": preset}), parse_workload(workload))
                row.estimated = activation_bytes(run.facts.arch, run.step, tier)
                row.estimate_ms = (time.perf_counter() - start) * 1000
            except InvalidWorkloadError as exc:
                row.note = f"skipped: {exc.message}"
                continue
            start = time.perf_counter()
            row.measured = measure_activation_bytes(
                model,
                tier,
                seq_len=seq,
                micro_batch_size=args.batch,
                dtype=args.dtype,
                attention=args.attention,
            )
            row.measure_s = time.perf_counter() - start
            row.error = (row.estimated - row.measured) / row.measured * 100
    return rows


def _build(build_meta_model: object, config: object, attention: str) -> object:
    """Build for the requested attention; an architecture without it builds as eager."""
    from ckpt_core._errors import ModelConfigError

    try:
        return build_meta_model(config, attention=attention)  # type: ignore[operator]
    except ModelConfigError:
        return build_meta_model(config, attention="eager")  # type: ignore[operator]


def _time_70b(args: argparse.Namespace) -> None:
    """Cold: build a 70B-class preset on meta and measure seq 8192, every tier."""
    from ckpt_core._configs.model_config import build_meta_model, load_model_config
    from ckpt_core._meta.measure import measure_activation_bytes

    for preset in ("llama-3.1-70b", "qwen2.5-72b"):
        start = time.perf_counter()
        model = build_meta_model(load_model_config({"preset": preset}), attention="sdpa")
        built = time.perf_counter() - start
        timings = []
        for tier in TIERS:
            start = time.perf_counter()
            measure_activation_bytes(
                model, tier, seq_len=8192, micro_batch_size=1, dtype=args.dtype
            )
            timings.append(f"{tier} {time.perf_counter() - start:.2f} s")
        print(f"{preset} seq 8192: meta build {built:.2f} s; measure " + ", ".join(timings))


if __name__ == "__main__":
    main()
