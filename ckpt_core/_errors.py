"""The exception hierarchy: one base error, a few precise subclasses.

Every error a caller can cause derives from `CkptError` and from the builtin
that fits it (`ValueError` for bad values, `RuntimeError` for bad states), so
`except ValueError` in a worker keeps working and the service can map each
class to one HTTP status without string matching.  `field` names the input
that was wrong (a dotted path such as ``"workload.seq_len"``) when one was.
"""

from __future__ import annotations


class CkptError(Exception):
    """Base of every error raised by ckpt_core."""

    code = "ckpt_error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidTierError(CkptError, ValueError):
    """A tier that is not one of the documented values."""

    code = "invalid_tier"


class InvalidGpuMemoryError(CkptError, ValueError):
    """GPU memory that is not a finite number > 0."""

    code = "invalid_gpu_memory"


class UnknownGpuError(CkptError, ValueError):
    """A GPU model name missing from the GPU table."""

    code = "unknown_gpu"


class UnsupportedTransformersVersionError(CkptError, ValueError):
    """A transformers version that cannot express the tier's kwargs."""

    code = "unsupported_transformers_version"


class InvalidGranularityError(CkptError, ValueError):
    """A hook granularity that is not full / medium / selective."""

    code = "invalid_granularity"


class CheckpointConflictError(CkptError, RuntimeError):
    """Hooks asked for on a model whose HF checkpointing is already on."""

    code = "checkpoint_conflict"


class ModelConfigError(CkptError, ValueError):
    """A model config (preset or inline) that cannot be used."""

    code = "invalid_model_config"


class UnknownPresetError(ModelConfigError):
    """A preset name that is not bundled."""

    code = "unknown_preset"


class ConfigTooLargeError(ModelConfigError):
    """A config over the size bounds (layers, hidden size, parameters, ...)."""

    code = "config_too_large"


class InvalidWorkloadError(CkptError, ValueError):
    """A workload description (sequence length, dtype, ...) that is not valid."""

    code = "invalid_workload"
