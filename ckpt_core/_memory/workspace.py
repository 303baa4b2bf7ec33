"""cuBLAS workspaces: what PyTorch allocates per cuBLAS handle, through the caching allocator.

PyTorch binds a workspace to each (cuBLAS handle, stream) at its first cuBLAS
call and keeps it until ``torch._C._cuda_clearCublasWorkspaces()``
(``aten/src/ATen/cuda/CublasHandlePool.cpp``).  Handles are per thread, so a
training step holds two: the Python thread's, made at the forward's first
matmul, and the one of autograd's CUDA device thread, made at the backward's
first matmul.  The default size (no ``CUBLAS_WORKSPACE_CONFIG``) is ``:4096:8``
= 32 MiB on compute capability 9, 10, 11 and 12 (Hopper, Blackwell: torch's
current rule; older releases only 9.0) and ``:4096:2:16:8`` = 8.125 MiB before;
ROCm's hipBLAS takes 128 MiB on gfx942 (MI300X).  Pure arithmetic.
"""

from __future__ import annotations

from typing import Final

KIB: Final = 1 << 10
HOPPER_AND_LATER: Final = 4096 * 8 * KIB
EARLIER: Final = (4096 * 2 + 16 * 8) * KIB
MI300X: Final = 128 * 1024 * KIB

# GPU-table names (`ckpt_core._planning.gpus`) whose default differs from EARLIER.
_BY_GPU: Final[dict[str, int]] = {
    "H100-80GB": HOPPER_AND_LATER,
    "H100-NVL": HOPPER_AND_LATER,
    "H20": HOPPER_AND_LATER,
    "GH200": HOPPER_AND_LATER,
    "H200": HOPPER_AND_LATER,
    "B200": HOPPER_AND_LATER,
    "RTX 5090": HOPPER_AND_LATER,  # compute capability 12.0
    "RTX PRO 6000 Blackwell": HOPPER_AND_LATER,
    "MI300X": MI300X,
}


def blas_workspace_bytes(gpu: str | None) -> int:
    """One cuBLAS workspace on ``gpu`` (a GPU-table name, or None when it is not named)."""
    if gpu is None:
        return HOPPER_AND_LATER  # an unnamed GPU may be a Hopper: the larger CUDA default
    return _BY_GPU.get(gpu, EARLIER)
