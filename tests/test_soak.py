"""The soak script, shortened to 30 s: mixed traffic, no 5xx, RSS growth under 10%."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KINDS = {
    "resolve",
    "resolve estimate",
    "describe",
    "describe text",
    "presets",
    "dry-run hit",
    "dry-run miss",
    "bad tier",
    "malformed JSON",
    "wrong content type",
    "config too large",
    "unknown preset",
}


def test_a_30_s_soak_has_no_5xx_and_bounded_memory(tmp_path: Path) -> None:
    result_path = tmp_path / "soak.json"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "soak.py"),
            "--duration",
            "30",
            "--warmup",
            "5",
            "--json",
            str(result_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    result = json.loads(result_path.read_text())
    assert result["5xx"] == 0 and result["transport_errors"] == {}
    assert result["rss_growth"] < 0.10
    # The mix really ran: every kind of request, good and bad answers.
    assert set(result["latency_ms_by_kind"]) == KINDS
    statuses = {int(status) for status in result["statuses"]}
    assert {200, 400, 415, 422} <= statuses
    assert result["requests"] > 1000
