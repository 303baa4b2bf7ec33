"""scripts/setup.sh installs only when pyproject.toml or the extras' lock changed.

Run on a copy of the project's install inputs with a stand-in ``python3`` on
PATH that creates the venv's ``python`` and records every call of it, so no
real pip runs: what is checked is which runs install, not pip itself.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/usr/bin/env bash
if [[ "$1" == "-m" && "$2" == "venv" ]]; then
    mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0
fi
echo "$*" >>"$CALLS"
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    copy = tmp_path / "project"
    (copy / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "setup.sh", copy / "scripts" / "setup.sh")
    shutil.copy2(ROOT / "pyproject.toml", copy / "pyproject.toml")
    shutil.copytree(ROOT / "requirements", copy / "requirements")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return copy


def _setup(project: Path, extras: str) -> list[str]:
    """The pip calls one run of setup.sh made (one per line)."""
    calls = project.parent / "calls.txt"
    calls.write_text("")
    env = {
        **os.environ,
        "PATH": f"{project.parent / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "CALLS": str(calls),
    }
    done = subprocess.run(
        ["bash", str(project / "scripts" / "setup.sh"), extras],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return calls.read_text().splitlines()


def test_a_second_run_installs_nothing(project: Path) -> None:
    first = _setup(project, "service")
    assert any("-c requirements/service.lock -e .[service]" in call for call in first), first
    assert _setup(project, "service") == []


def test_a_changed_pyproject_or_lock_installs_again(project: Path) -> None:
    _setup(project, "service")
    with (project / "pyproject.toml").open("a") as file:
        file.write("\n# a change\n")
    assert _setup(project, "service"), "pyproject.toml changed: must install"
    assert _setup(project, "service") == []
    with (project / "requirements" / "service.lock").open("a") as file:
        file.write("\n# a change\n")
    assert _setup(project, "service"), "the lock changed: must install"


def test_each_extra_has_its_own_stamp(project: Path) -> None:
    _setup(project, "service")
    test_calls = _setup(project, "test")
    assert any("-c requirements/test.lock -e .[test]" in call for call in test_calls)
    assert _setup(project, "service") == []


def test_the_worker_extra_installs_without_a_lock(project: Path) -> None:
    calls = _setup(project, "worker")
    assert any(
        call.endswith("install --quiet --disable-pip-version-check -e .[worker]") for call in calls
    ), calls


def test_an_unknown_extra_is_refused(project: Path) -> None:
    done = subprocess.run(
        ["bash", str(project / "scripts" / "setup.sh"), "sevrice"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "no extra 'sevrice'" in done.stderr
