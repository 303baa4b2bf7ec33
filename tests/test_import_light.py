"""`import ckpt_core` loads no torch, transformers, pydantic or FastAPI (docs/design.md)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "transformers", "pydantic", "fastapi", "httpx", "numpy")


def test_import_ckpt_core_loads_nothing_heavy() -> None:
    code = (
        "import sys, ckpt_core\n"
        "plan = ckpt_core.make_plan('auto', gpu='A100-80GB')\n"
        f"loaded = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "assert plan.granularity == 'medium'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_lazy_names_load_on_first_use() -> None:
    code = (
        "import sys, ckpt_core\n"
        "assert 'ckpt_core._hooks.install' not in sys.modules\n"
        "from ckpt_core._hooks.install import install_checkpoint_hooks\n"
        "assert ckpt_core.install_checkpoint_hooks is install_checkpoint_hooks\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_every_public_name_resolves() -> None:
    import ckpt_core

    for name in ckpt_core.__all__:
        assert getattr(ckpt_core, name) is not None, name
