"""The rule auto answers by, checked on an answer's estimate (tests share it)."""

from __future__ import annotations

from typing import Any


def assert_auto_rule(tiers: dict[str, Any], chosen: dict[str, Any]) -> None:
    """No tier clear of the error band recomputes less; a tight choice has the least memory."""
    for row in tiers.values():
        if row["verdict"] == "fits":
            assert chosen["recompute_flops_ratio"] <= row["recompute_flops_ratio"]
    if chosen["tight"]:
        assert not any(row["verdict"] == "fits" for row in tiers.values())
        assert chosen["peak_bytes"] == min(row["peak_bytes"] for row in tiers.values())
