"""A dry-run worker that cannot start says why; a shutdown mid-start leaves nothing behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings

REPO = Path(__file__).resolve().parents[1]

# A script that builds the app at module level, without a __main__ guard: every
# worker imports it again.  It reports what /readyz says once it names a cause.
# Warning level: only the failure lines are logged, each write a line or two.
UNGUARDED = """
import time
from fastapi.testclient import TestClient
from service.app import create_app
from service.settings import Settings

app = create_app(Settings(dry_run_workers=1, log_level="warning"))
with TestClient(app) as client:
    deadline = time.monotonic() + 90  # the forkserver imports torch first
    while time.monotonic() < deadline:
        answer = client.get("/readyz")
        if "worker" in answer.text:
            break
        time.sleep(0.05)
    time.sleep(3.5)  # two more retries (1 s, then 2 s of backoff)
    print("READYZ", answer.status_code, answer.text, flush=True)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}


def test_an_unguarded_script_gets_a_503_naming_the_main_guard(tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(UNGUARDED), "utf-8")
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=150,
        env=_env(),
        cwd=tmp_path,
        check=False,
    )
    readyz = next(line for line in result.stdout.splitlines() if line.startswith("READYZ"))
    status, body = readyz.split(" ", 2)[1:]
    assert status == "503", result.stdout
    detail = json.loads(body)["detail"]
    assert 'if __name__ == "__main__":' in detail and "exited before it was ready" in detail
    failures = [line for line in _json_lines(result.stderr) if "failed to start" in line["message"]]
    # Retried (at least twice by now) but logged once: one line per distinct failure,
    # of each pool.
    pools = sorted(line["message"].split(" worker failed")[0] for line in failures)
    assert pools == ["dry-run", "estimate"], result.stderr[-3000:]
    assert all(line["level"] == "error" and "exc_info" not in line for line in failures)


def test_shutting_down_while_a_worker_starts_leaves_no_process_and_no_traceback(
    capfd: object,
) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    app = create_app(Settings(dry_run_workers=1, log_level="info"))
    with TestClient(app) as client:
        assert client.get("/readyz").status_code == 503  # still starting
    after = psutil.Process().children(recursive=True)
    workers = [p for p in after if p.pid not in before and _is_worker(p)]
    assert not workers, workers
    err = capfd.readouterr().err  # type: ignore[attr-defined]
    assert "Traceback" not in err and "cannot schedule new futures" not in err


def _json_lines(stderr: str) -> list[dict[str, Any]]:
    """The service's JSON log records in `stderr`, wherever they start.

    The workers share the service's stderr, and the forkserver writes a failed
    worker's traceback a few characters per write, so a log line (one write)
    may begin in the middle of a traceback line.
    """
    decoder = json.JSONDecoder()
    starts = (match.start() for match in re.finditer(r'\{"ts":', stderr))
    return [decoder.raw_decode(stderr, start)[0] for start in starts]


def _is_worker(process: psutil.Process) -> bool:
    """A live dry-run worker: a child of the forkserver (which the session shares)."""
    try:
        parent = process.parent()
        forked = parent is not None and "multiprocessing.forkserver" in " ".join(parent.cmdline())
        return forked and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
