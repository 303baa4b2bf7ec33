"""PyTorch's CUDA caching allocator: rounding and segment sizes (placeholder)."""

from __future__ import annotations

from typing import Final

from ckpt_core._arch import Arch
from ckpt_core._ledger import Step

MIB: Final = 1 << 20
WORKSPACE_BYTES: Final = 0


def reserved_bytes(arch: Arch, step: Step, tier: str, allocated: int) -> int:
    return -(-allocated // (2 * MIB)) * 2 * MIB
