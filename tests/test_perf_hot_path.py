"""Hot-path caches behave like the lookups they replace (speed itself is measured in bench/)."""

from __future__ import annotations

from importlib import metadata
from unittest import mock

from ckpt_core import make_plan
from ckpt_core._plan import ASSUMED_TRANSFORMERS_VERSION
from ckpt_core._planning.training_args import installed_transformers_version


def test_installed_version_is_the_metadata_version() -> None:
    assert installed_transformers_version() == metadata.version("transformers")


def test_installed_version_is_read_once_per_process() -> None:
    installed_transformers_version.cache_clear()
    try:
        with mock.patch.object(metadata, "version", wraps=metadata.version) as version:
            first = make_plan("full").transformers_version
            second = make_plan("medium", 40.0).transformers_version
        assert first == second == metadata.version("transformers")
        assert version.call_count == 1
    finally:
        installed_transformers_version.cache_clear()


def test_missing_transformers_is_cached_as_none() -> None:
    installed_transformers_version.cache_clear()
    try:
        with mock.patch.object(
            metadata, "version", side_effect=metadata.PackageNotFoundError("transformers")
        ):
            assert installed_transformers_version() is None
            # make_plan then assumes the newest known release instead of failing
            assert make_plan("full").transformers_version == ASSUMED_TRANSFORMERS_VERSION
    finally:
        installed_transformers_version.cache_clear()
