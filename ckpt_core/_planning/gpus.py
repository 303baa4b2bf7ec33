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
from ckpt_core._planning.tiers import validate_gpu_memory_gb


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU model: its canonical name, memory as reported, and where that came from."""

    name: str
    marketed_gb: int
    memory_gib: float
    aliases: tuple[str, ...]
    source: str


# Memory as torch reports it (`total_memory`, printed in MiB by its repr or by
# CUDA's deviceQuery, which reads the same field) on a recent Linux driver,
# taken from public captures named in `source`.  The value moves by up to
# ~300 MiB with driver version and ECC; no card in this table is that close to
# a threshold (24 GiB = 24576 MiB, 80 GiB = 81920 MiB).  Where captures of one
# card differ, the smallest is taken (the safe side).  A name torch reports for
# two memory sizes (RTX 3060, RTX 3080, RTX 4060 Ti) is no alias: the table's
# name says which (``"RTX 3060-12GB"``).
_MIB = 1 / 1024

GPUS: Final[tuple[GpuSpec, ...]] = (
    GpuSpec("T4", 16, 15109 * _MIB, ("Tesla T4",), "deviceQuery / torch repr, modal-client#2797"),
    GpuSpec(
        "V100-16GB",
        16,
        16160 * _MIB,
        ("Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB"),
        "torch repr",
    ),
    GpuSpec(
        "P100-16GB",
        16,
        16280 * _MIB,
        ("Tesla P100-PCIE-16GB",),
        "torch repr (Colab and Kaggle captures, torch 1.5 to 1.8)",
    ),
    GpuSpec(
        "RTX 3060 Ti",
        8,
        7972 * _MIB,
        ("NVIDIA GeForce RTX 3060 Ti",),
        "deviceQuery on Linux, CUDA 12.2 (8192 MiB on Windows)",
    ),
    GpuSpec(
        "RTX 3070",
        8,
        7817 * _MIB,
        ("NVIDIA GeForce RTX 3070",),
        "deviceQuery on Linux (7817 to 7974 MiB by driver; 8192 MiB on Windows)",
    ),
    GpuSpec(
        "RTX 2080 Ti",
        11,
        10823 * _MIB,
        ("NVIDIA GeForce RTX 2080 Ti", "GeForce RTX 2080 Ti"),
        "deviceQuery on Linux, public issue threads (10823 to 11019 MiB by driver)",
    ),
    GpuSpec(
        "RTX 3080-10GB",
        10,
        9987 * _MIB,
        (),
        "deviceQuery on Linux (nvidia-smi on the same machine: 10240 MiB)",
    ),
    GpuSpec(
        "RTX 3060-12GB",
        12,
        12004 * _MIB,
        (),
        "deviceQuery on Linux, public issue threads (12004 to 12044 MiB by driver)",
    ),
    GpuSpec("RTX 3080 Ti", 12, 12045 * _MIB, ("NVIDIA GeForce RTX 3080 Ti",), "deviceQuery"),
    GpuSpec(
        "RTX 4060 Ti-16GB",
        16,
        16076 * _MIB,
        (),
        "deviceQuery, thamada/nvidia-smi package/RTX4060Ti",
    ),
    GpuSpec(
        "RTX 4070 Ti SUPER",
        16,
        15934 * _MIB,
        ("NVIDIA GeForce RTX 4070 Ti SUPER",),
        "torch repr, pnmartinez/simple-computer-use and mathisweil/minihack-ReMDM-planner "
        "(15934, 15974 MiB)",
    ),
    GpuSpec(
        "RTX 4080",
        16,
        16049 * _MIB,
        ("NVIDIA GeForce RTX 4080",),
        "torch repr, brainglobe/brainglobe.github.io (cellfinder's speed-up page)",
    ),
    GpuSpec(
        "RTX 4080 SUPER",
        16,
        16072 * _MIB,
        ("NVIDIA GeForce RTX 4080 SUPER",),
        "deviceQuery, CUDA 12.4",
    ),
    GpuSpec(
        "RTX 4000 Ada",
        20,
        20147 * _MIB,
        ("NVIDIA RTX 4000 Ada Generation",),
        "deviceQuery, thamada/nvidia-smi nvsim/RTX4000Ada",
    ),
    GpuSpec("P40", 24, 22919 * _MIB, ("Tesla P40",), "deviceQuery, CUDA 9.2 and 10.0"),
    GpuSpec("L4", 24, 22478 * _MIB, ("NVIDIA L4",), "deviceQuery, thamada/nvidia-smi gls/L4"),
    GpuSpec("A10", 24, 22516 * _MIB, ("NVIDIA A10",), "deviceQuery, detect-gpu#3"),
    GpuSpec("A10G", 24, 22587 * _MIB, ("NVIDIA A10G",), "torch repr, NVIDIA/DCGM#232"),
    GpuSpec(
        "RTX 3090",
        24,
        24154 * _MIB,
        ("NVIDIA GeForce RTX 3090", "3090"),
        "deviceQuery, thamada/nvidia-smi gls/RTX3090",
    ),
    GpuSpec(
        "RTX 4090",
        24,
        24210 * _MIB,
        ("NVIDIA GeForce RTX 4090", "4090"),
        "deviceQuery, thamada/nvidia-smi gls/RTX4090",
    ),
    GpuSpec(
        "RTX 3090 Ti",
        24,
        24114 * _MIB,
        ("NVIDIA GeForce RTX 3090 Ti",),
        "torch repr (Linux, driver 590)",
    ),
    GpuSpec(
        "RTX A5000",
        24,
        24114 * _MIB,
        ("NVIDIA RTX A5000", "A5000"),
        "torch repr (24114 and 24138 MiB)",
    ),
    GpuSpec(
        "V100-32GB",
        32,
        32510 * _MIB,
        ("Tesla V100-SXM2-32GB", "Tesla V100-PCIE-32GB"),
        "torch repr / deviceQuery",
    ),
    GpuSpec(
        "RTX 5090",
        32,
        32117 * _MIB,
        ("NVIDIA GeForce RTX 5090",),
        "deviceQuery, aikitoria/open-gpu-kernel-modules#1 and NVIDIA/nccl#1637 (32117, 32120)",
    ),
    GpuSpec(
        "A100-40GB",
        40,
        40339 * _MIB,
        ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB", "A100 40GB"),
        "deviceQuery, bottlerocket#3873",
    ),
    GpuSpec(
        "A40",
        48,
        45403 * _MIB,
        ("NVIDIA A40",),
        "deviceQuery (ECC on), thamada/nvidia-smi nvsim/A40",
    ),
    GpuSpec(
        "L40S",
        48,
        45589 * _MIB,
        ("NVIDIA L40S",),
        "deviceQuery / torch repr, thamada/nvidia-smi nvsim/L40S",
    ),
    GpuSpec("RTX A6000", 48, 48676 * _MIB, ("NVIDIA RTX A6000", "A6000"), "torch repr"),
    GpuSpec("Quadro RTX 8000", 48, 48601 * _MIB, ("RTX 8000",), "torch repr"),
    GpuSpec(
        "RTX 6000 Ada",
        48,
        48622 * _MIB,
        ("NVIDIA RTX 6000 Ada Generation",),
        "torch repr; deviceQuery 48640 MiB (ECC off), thamada/nvidia-smi gls/RTX6000Ada",
    ),
    GpuSpec(
        "A100-80GB",
        80,
        81158 * _MIB,
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
        "deviceQuery, thamada/nvidia-smi nvsim/A100SXM",
    ),
    GpuSpec(
        "H100-80GB",
        80,
        81106 * _MIB,
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "H100-SXM"),
        "deviceQuery, thamada/nvidia-smi nvsim/H100SXM; NVIDIA/nccl#1264",
    ),
    GpuSpec(
        "H100-NVL",
        94,
        95235 * _MIB,
        ("NVIDIA H100 NVL",),
        "deviceQuery, thamada/nvidia-smi gls/H100NVL",
    ),
    GpuSpec(
        "GH200",
        96,
        96768 * _MIB,
        ("NVIDIA GH200 480GB", "NVIDIA GH200 120GB"),
        "deviceQuery (ECC on): 96768 MiB on a GH200 120GB (CSCS Alps), 97280 MiB on a "
        "GH200 480GB (slitvinov/grace)",
    ),
    GpuSpec(
        "RTX PRO 6000 Blackwell",
        96,
        97250 * _MIB,
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition",),
        "torch repr (torch 2.7, Server Edition)",
    ),
    GpuSpec(
        "H20",
        96,
        97285 * _MIB,
        ("NVIDIA H20",),
        "torch repr quoted in a public Triton kernel's source",
    ),
    GpuSpec("H200", 141, 143156 * _MIB, ("NVIDIA H200", "H200-141GB"), "torch repr"),
    GpuSpec("B200", 180, 182642 * _MIB, ("NVIDIA B200",), "torch repr; pytorch/ao#4002"),
    GpuSpec("MI300X", 192, 196592 * _MIB, ("AMD Instinct MI300X",), "ROCm torch repr, ROCm#4203"),
)


# Below compute capability 8.0, where PyTorch has no flash attention kernel
# (``check_flash_attention_hardware_support`` in aten's sdp_utils.cpp).
NO_FLASH_SDPA: Final = frozenset(
    {"T4", "V100-16GB", "V100-32GB", "P100-16GB", "P40", "RTX 2080 Ti", "Quadro RTX 8000"}
)


def flash_sdpa(gpu: str | None) -> bool:
    """Whether sdpa's flash kernel runs on ``gpu`` (a table name; None, a GPU not named,
    is taken to be one that has it)."""
    return gpu not in NO_FLASH_SDPA


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
# A name followed by one of these is another card (RTX 3060 Ti is no RTX 3060), not a
# memory size of the same one (RTX 3060-12GB).
_OTHER_CARD: Final = ("ti", "super")


def lookup_gpu(name: str) -> GpuSpec:
    """The `GpuSpec` for a GPU name such as ``"A100-80GB"`` or ``"NVIDIA H100 80GB HBM3"``."""
    if not isinstance(name, str) or not name.strip():
        raise UnknownGpuError(f"gpu must be a non-empty GPU name, got {name!r}", field="gpu")
    key = _key(name)
    spec = _BY_KEY.get(key)
    if spec is not None:
        return spec
    # A name that starts several table names ("A100", "H100") says too little to choose.
    candidates = sorted(
        {
            spec.name
            for alias, spec in _BY_KEY.items()
            if key and alias.startswith(key) and not alias[len(key) :].startswith(_OTHER_CARD)
        }
    )
    if len(candidates) > 1:
        raise UnknownGpuError(
            f"gpu {name!r} is ambiguous: {' or '.join(candidates)}; name one of them, or pass "
            "gpu_memory_gb (GiB)",
            field="gpu",
        )
    if candidates:  # never a guess: torch names the 8 GB and 12 GB RTX 3060 alike
        raise UnknownGpuError(
            f"unknown gpu {name!r}; did you mean {candidates[0]}? or pass gpu_memory_gb (GiB)",
            field="gpu",
        )
    known = ", ".join(spec.name for spec in GPUS)
    raise UnknownGpuError(
        f"unknown gpu {name!r}; known: {known}; or pass gpu_memory_gb (GiB)", field="gpu"
    )


def gpu_memory_for(gpu_memory_gb: object, gpu: str | None) -> float | None:
    """GPU memory in GiB from a number or a GPU name; giving both is an error."""
    if gpu is not None and gpu_memory_gb is not None:
        raise InvalidGpuMemoryError(
            "give either gpu_memory_gb or gpu, not both", field="gpu_memory_gb"
        )
    if gpu is not None:
        return lookup_gpu(gpu).memory_gib
    return validate_gpu_memory_gb(gpu_memory_gb)
