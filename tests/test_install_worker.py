"""The README's worker install, from a new virtual environment, then its quick start.

``python -m venv`` (no system site-packages), then the README's install line,
``python -m pip install ".[worker]"``, on a copy of the project's sources, with
the test lock as constraints so the environment gets the releases the suite
runs on (and the CPU torch wheel) from wherever pip finds packages.  Then the
README's worker quick start runs there as pasted (it imports ckpt_core, builds
a plan and constructs TrainingArguments), and ``examples/finetune_tiny.py``
trains with the same install.  Slow (marked in tests/_markers.py): pip
resolves and installs torch, transformers, accelerate and httpx.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
INSTALL_LINE = 'python -m pip install ".[worker]"'


def _quick_start() -> str:
    text = README.read_text("utf-8")
    section = text[text.index("## Worker quick start") :]
    assert f"`{INSTALL_LINE}`" in section.split("```", 1)[0], "the install line comes first"
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "the quick start has a Python snippet"
    return match.group(1)


def _copy_sources(target: Path) -> None:
    target.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, target / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("ckpt_core", "service", "examples"):
        shutil.copytree(ROOT / package, target / package, ignore=ignore)


def test_the_worker_install_runs_the_quick_start(tmp_path: Path) -> None:
    source, venv, work = tmp_path / "src", tmp_path / "venv", tmp_path / "work"
    _copy_sources(source)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    # The README's line, run where it says (the checkout), constrained to the tested releases.
    command = [*INSTALL_LINE.replace("python", str(python), 1).split()]
    command[-1] = command[-1].strip('"')
    install = subprocess.run(
        [*command, "--quiet", "-c", str(ROOT / "requirements" / "test.lock")],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert install.returncode == 0, install.stderr[-4000:]

    isolated = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('fastapi'))"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert isolated.stdout.strip() == "None", "the venv sees packages it did not install"

    work.mkdir()
    snippet = _quick_start()
    printed = re.search(r"^print\(.*\)  # (.+)$", snippet, re.MULTILINE)
    assert printed, "the quick start's print line says what it prints"
    check = (
        "print(type(args).__name__, type(callback).__name__,"
        " all(getattr(args, k) == v for k, v in plan.training_arguments.items()))"
    )
    run = subprocess.run(
        [str(python), "-c", f"{snippet}\n{check}\n"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout.splitlines() == [
        printed.group(1),
        "TrainingArguments CheckpointPlanCallback True",
    ], run.stdout

    # The README's example fine-tunes with the same install (Trainer needs accelerate).
    example = subprocess.run(
        [str(python), str(source / "examples" / "finetune_tiny.py"), "--steps", "2"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert example.returncode == 0, example.stderr[-4000:]
    for tier in ("full", "medium", "selective"):
        assert f"{tier} vs off: same losses" in example.stdout, example.stdout
