"""Device memory a CUDA process holds outside PyTorch's caching allocator.

The CUDA context (driver state, the loaded kernel images, cuBLAS handles)
appears in ``nvidia-smi`` and counts against the card, but never in
``torch.cuda.memory_reserved()``.  Its size depends on the GPU, the driver and
the CUDA / PyTorch build, so it is taken from measurements where there are
some, and from a stated allowance otherwise:

- measured: the process memory minus the reserved pool, read after a training
  step (``mem_get_info`` total - free - reserved), by GPU name;
- otherwise `DEFAULT_CONTEXT_BYTES`, an allowance chosen to stay above every
  measured value (not a measurement of any other GPU: record one with
  ``bench/gpu_step.py`` and add it here).

Pure arithmetic.
"""

from __future__ import annotations

from typing import Final

MIB: Final = 1 << 20

# GPU-table name (`ckpt_core._planning.gpus`) -> (bytes, where it was measured).
MEASURED: Final[dict[str, tuple[int, str]]] = {
    "T4": (
        int(140.875 * MIB),
        "cuda_context_mib of every row in ../shared/data/gpu-steps (torch 2.10 and 2.14)",
    ),
    "H200": (
        int(766.8125 * MIB),
        "cuda_context_mib of every row in bench/data/sweep.json (torch 2.11, CUDA 13.0)",
    ),
}
DEFAULT_CONTEXT_BYTES: Final = 768 * MIB
DEFAULT_SOURCE: Final = "allowance for a GPU without a measurement (not measured)"


def context_bytes(gpu: str | None) -> tuple[int, str]:
    """The CUDA context of ``gpu`` (a GPU-table name or None) and where the figure comes from."""
    if gpu is not None and gpu in MEASURED:
        return MEASURED[gpu]
    return DEFAULT_CONTEXT_BYTES, DEFAULT_SOURCE
