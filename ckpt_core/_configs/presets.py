"""Bundled presets: the published ``config.json`` of popular public models.

Each ``presets/<name>.json`` is the model repository's ``config.json`` as
published, plus two provenance keys that are stripped before use:
``_source`` (the repository the config comes from) and
``_published_parameters`` (the parameter count the model card / Hub states).
Fields that would need remote code (``auto_map``) are left out of the files.

The files ship as package data and are read through `importlib.resources`
once per process; callers get deep copies, so nothing can mutate the cache.
Pure Python: importing this module loads no torch or transformers.
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import asdict, dataclass
from typing import Any, Final

from ckpt_core._errors import UnknownPresetError

SOURCE_KEY: Final = "_source"
PUBLISHED_PARAMETERS_KEY: Final = "_published_parameters"
_PROVENANCE_KEYS: Final = (SOURCE_KEY, PUBLISHED_PARAMETERS_KEY)


@dataclass(frozen=True, slots=True)
class PresetInfo:
    """One bundled preset, as ``GET /presets`` lists it.

    ``published_parameters`` is the count the model card states (e.g. 8.03e9
    for Llama-3.1-8B); the meta-built model agrees with it within a few %.
    """

    name: str
    model_type: str
    architecture: str | None
    published_parameters: int
    source: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@functools.cache
def _bundled() -> dict[str, dict[str, Any]]:
    """Every preset file parsed once: name -> file content (provenance included)."""
    from importlib import resources  # slow to import (tempfile, zipfile): first use only

    folder = resources.files("ckpt_core").joinpath("presets")
    presets: dict[str, dict[str, Any]] = {}
    for entry in folder.iterdir():
        if entry.name.endswith(".json"):
            presets[entry.name.removesuffix(".json")] = json.loads(entry.read_text("utf-8"))
    return dict(sorted(presets.items()))


def preset_names() -> list[str]:
    """The bundled preset names, sorted."""
    return list(_bundled())


def load_preset(name: object) -> dict[str, Any]:
    """The HF config dict of preset ``name`` (a fresh copy, provenance keys stripped).

    Names are case-insensitive and trimmed (``" Llama-3.1-8B"`` is ``llama-3.1-8b``).
    Raises `UnknownPresetError` (field ``"model.preset"``) listing the known names.
    """
    data = _bundled().get(canonical_preset_name(name)) if isinstance(name, str) else None
    if data is None:
        raise UnknownPresetError(
            f"unknown preset {name!r}; known presets: {', '.join(preset_names())}",
            field="model.preset",
        )
    return {key: copy.deepcopy(value) for key, value in data.items() if key not in _PROVENANCE_KEYS}


def canonical_preset_name(name: str) -> str:
    """The bundled file name a preset name refers to (all preset names are lower case)."""
    return name.strip().casefold()


def list_presets() -> list[PresetInfo]:
    """Every bundled preset with its model type, architecture and published size."""
    return [_info(name, data) for name, data in _bundled().items()]


def _info(name: str, data: dict[str, Any]) -> PresetInfo:
    architectures = data.get("architectures") or [None]
    return PresetInfo(
        name=name,
        model_type=data["model_type"],
        architecture=architectures[0],
        published_parameters=int(data[PUBLISHED_PARAMETERS_KEY]),
        source=data[SOURCE_KEY],
    )
