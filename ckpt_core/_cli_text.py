"""How the ``ckpt`` command line prints a plan and a dry-run report as text.

``--json`` prints the objects themselves; this is the aligned ``key  value`` text
a person reads instead.  Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ckpt_core._plan import Plan

__all__ = ["plan_text", "report_text"]


def plan_text(plan: Plan) -> str:
    rows: list[tuple[str, str]] = [
        ("tier", plan.tier),
        ("granularity", plan.granularity or "off"),
        ("hooks", plan.hooks or "none"),
    ]
    kwargs = plan.training_arguments
    rows += [("TrainingArguments", f"{k}={json.dumps(v)}") for k, v in kwargs.items()]
    if plan.block_plan:
        block_plan = plan.block_plan
        rows.append(("full blocks", _indices(block_plan["full"], block_plan["blocks"])))
        if block_plan["selective"]:
            rows.append(
                ("selective blocks", _indices(block_plan["selective"], block_plan["blocks"]))
            )
    if plan.gpu_memory_gb is not None:
        gpu = f" ({plan.gpu})" if plan.gpu else ""
        rows.append(("gpu memory", f"{plan.gpu_memory_gb:g} GiB{gpu}"))
    rows += [
        ("transformers", plan.transformers_version),
        ("description", plan.description),
        ("reason", plan.reason),
    ]
    text = _table(rows)
    if plan.estimate:
        text += "\n\nestimate:\n" + _mapping_text(plan.estimate, indent=2)
    return text


def _indices(indices: list[int], blocks: int) -> str:
    return f"{len(indices)} of {blocks}: {', '.join(map(str, indices))}"


def report_text(report: Mapping[str, Any]) -> str:
    rows = [
        ("model", f"{report['model_type']} ({report['architecture']})"),
        ("parameters", f"{report['parameters']:,}"),
        ("tier", f"{report['tier']} -> {report['granularity'] or 'off'}"),
        ("blocks", str(report["blocks"])),
        ("checkpointed", f"{report['hooked']} modules"),
        ("by", "HF's own checkpointing" if report["native"] else "ckpt hooks"),
        ("elapsed", f"{report['elapsed_ms']:g} ms"),
    ]
    if report.get("reason"):
        rows.append(("chosen", report["reason"]))
    if report["measured"]:
        rows += [("measured", f"{k}={_scalar(v)}") for k, v in report["measured"].items()]
    text = _table(rows)
    if report["modules"]:
        text += "\n\nmodules:\n" + "\n".join(f"  {name}" for name in report["modules"])
    return text


def _table(rows: Sequence[tuple[str, str]]) -> str:
    width = max(len(key) for key, _ in rows)
    lines = []
    previous = None
    for key, value in rows:
        label = "" if key == previous else key  # repeated keys read as one block
        lines.append(f"{label:<{width}}  {value}")
        previous = key
    return "\n".join(lines)


def _mapping_text(data: Mapping[str, Any], *, indent: int = 0) -> str:
    """Nested mappings as indented ``key: value`` lines; lists of scalars on one line."""
    pad = " " * indent
    lines = []
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            lines.append(f"{pad}{key}:")
            lines.append(_mapping_text(value, indent=indent + 2))
        elif isinstance(value, list) and value and isinstance(value[0], Mapping):
            lines.append(f"{pad}{key}:")
            lines += [_mapping_text(item, indent=indent + 2) + "\n" for item in value]
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}")
    return "\n".join(lines)


def _scalar(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(item) for item in value) if value else "(none)"
    if isinstance(value, float):
        return f"{value:,.6g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "(not set)" if value is None else str(value)
