"""Both sides of each transformers release boundary, with real TrainingArguments + Trainer.

Other releases are installed once (pip --target, cached under .cache/) and run
in a subprocess: the kwargs we emit for a version must be accepted by that
version without a FutureWarning and make its Trainer checkpoint exactly the
tier's layers; the other generation's names must fail or warn there, which is
why the boundary matters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import transformers

from ckpt_core import resolve_gradient_checkpointing

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "tf-compat"
PROBE = Path(__file__).with_name("compat_probe.py")

# Each side of every boundary: 5.15.1 | 5.16.0 (every_n_layers), 5.22.2 | 5.23+ (names).
OTHER_RELEASES = ("5.15.1", "5.16.0", "5.22.2")
TIERS = ("off", "full", "medium", "selective")
ALL_FOUR_LAYERS = [0, 1, 2, 3]


def _site_for(version: str) -> Path | None:
    """A directory holding `version` of transformers (and its pinned deps), or None: installed."""
    if version == transformers.__version__:
        return None
    target = CACHE / version
    if not (target / "transformers").is_dir():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--target",
                str(target),
                f"transformers=={version}",
            ],
            check=True,
        )
    return target


def _run_probe(version: str, cases: dict[str, dict]) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    site = _site_for(version)
    if site is not None:
        env["PYTHONPATH"] = str(site)
    done = subprocess.run(
        [sys.executable, str(PROBE), json.dumps(cases)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["version"] == version
    return report["results"]


def _expected_layers(tier: str, version: tuple[int, int]) -> list[int]:
    if tier == "full":
        return ALL_FOUR_LAYERS
    if tier == "medium" and version >= (5, 16):
        return [0, 2]  # every_n_layers=2
    return []  # off, selective, medium before 5.16: HF off, hooks do the work


@pytest.fixture(scope="module", params=(transformers.__version__, *OTHER_RELEASES))
def release(request: pytest.FixtureRequest) -> tuple[str, dict]:
    version = request.param
    cases = {
        tier: resolve_gradient_checkpointing(tier, transformers_version=version) for tier in TIERS
    }
    # The other generation's names, to show each boundary is real.
    cases["old_names_full"] = {
        "gradient_checkpointing": True,
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
    }
    cases["new_names_full"] = {
        "activation_checkpointing": True,
        "activation_checkpointing_kwargs": {"use_reentrant": False},
    }
    cases["old_names_every_2"] = {
        "gradient_checkpointing": True,
        "gradient_checkpointing_kwargs": {"use_reentrant": False, "every_n_layers": 2},
    }
    return version, _run_probe(version, cases)


def test_our_kwargs_make_the_trainer_do_exactly_the_tier(release: tuple[str, dict]) -> None:
    version, results = release
    major_minor = tuple(int(part) for part in version.split(".")[:2])
    for tier in TIERS:
        result = results[tier]
        assert "error" not in result, (version, tier, result)
        assert result["future_warnings"] == [], (version, tier)
        assert result["checkpointed_layers"] == _expected_layers(tier, major_minor), (version, tier)


def test_the_name_boundary_is_real(release: tuple[str, dict]) -> None:
    version, results = release
    major_minor = tuple(int(part) for part in version.split(".")[:2])
    old, new = results["old_names_full"], results["new_names_full"]
    if major_minor >= (5, 23):
        assert new["checkpointed_layers"] == ALL_FOUR_LAYERS
        assert new["future_warnings"] == []
        assert old["future_warnings"], "old names should be deprecated here"
    else:
        assert "activation_checkpointing" in new["error"]
        assert old["checkpointed_layers"] == ALL_FOUR_LAYERS
        assert old["future_warnings"] == []


def test_the_every_n_layers_boundary_is_real(release: tuple[str, dict]) -> None:
    version, results = release
    major_minor = tuple(int(part) for part in version.split(".")[:2])
    result = results["old_names_every_2"]
    if major_minor >= (5, 16):
        assert result["checkpointed_layers"] == [0, 2]
    else:
        # Silently ignored (forwarded to the layer's **kwargs): medium would become full,
        # which is why medium on these releases turns HF off and uses hooks.
        assert result["checkpointed_layers"] == ALL_FOUR_LAYERS
