"""GPUs by name, and the unit of ``gpu_memory_gb``.

``gpu_memory_gb`` is in GiB (2**30 bytes) of total device memory as software
reports it - ``torch.cuda.get_device_properties(i).total_memory / 2**30`` - not
the marketed decimal "GB" on the box.  An "80 GB" A100 reports about 79.2 GiB
(85.1 decimal GB): with GiB it lands on medium, as the seed's thresholds
intended; with decimal GB it would land on selective.  Callers that do not want
to think about it name the GPU instead (``gpu="A100-80GB"``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from ckpt_core._errors import InvalidGpuMemoryError, UnknownGpuError
from ckpt_core._tiers import validate_gpu_memory_gb


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU model: its canonical name, memory as reported, and where that came from."""

    name: str
    marketed_gb: int
    memory_gib: float
    aliases: tuple[str, ...]
    source: str


GPUS: Final[tuple[GpuSpec, ...]] = ()


def _key(name: str) -> str:
    """Normalise a GPU name: case, spaces, dashes, vendor prefixes do not matter."""
    key = re.sub(r"[^a-z0-9]", "", name.casefold())
    return re.sub(r"^(nvidia|amd|tesla|geforce|radeon|instinct)+", "", key)


def _index() -> dict[str, GpuSpec]:
    index: dict[str, GpuSpec] = {}
    for spec in GPUS:
        for alias in (spec.name, *spec.aliases):
            index[_key(alias)] = spec
    return index


_BY_KEY: Final[dict[str, GpuSpec]] = _index()


def lookup_gpu(name: str) -> GpuSpec:
    """The `GpuSpec` for a GPU name such as ``"A100-80GB"`` or ``"NVIDIA H100 80GB HBM3"``."""
    if not isinstance(name, str) or not name.strip():
        raise UnknownGpuError(f"gpu must be a non-empty GPU name, got {name!r}", field="gpu")
    spec = _BY_KEY.get(_key(name))
    if spec is None:
        known = ", ".join(spec.name for spec in GPUS)
        raise UnknownGpuError(
            f"unknown gpu {name!r}; known: {known}; or pass gpu_memory_gb (GiB)", field="gpu"
        )
    return spec


def gpu_memory_for(gpu_memory_gb: object, gpu: str | None) -> float | None:
    """GPU memory in GiB from a number or a GPU name; giving both is an error."""
    if gpu is not None and gpu_memory_gb is not None:
        raise InvalidGpuMemoryError(
            "give either gpu_memory_gb or gpu, not both", field="gpu_memory_gb"
        )
    if gpu is not None:
        return lookup_gpu(gpu).memory_gib
    return validate_gpu_memory_gb(gpu_memory_gb)
