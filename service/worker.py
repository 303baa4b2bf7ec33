"""What runs inside the worker processes (see `service.pool`): dry runs and estimates.

A job never raises: it returns its result, or the exception as data
(`as_data`), so one bad config costs one answer, not the worker.  Importing
this module is cheap (ckpt_core imports torch lazily); a dry-run worker
imports torch when it warms up.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from typing import Any, Final

from cachetools import LRUCache

from ckpt_core import CkptError, ConfigLimits, ModelConfig, dry_run, load_model_config, make_plan

# Imported by the forkserver once, before it forks any worker: each worker
# then starts with them loaded.  transformers.modeling_utils is most of the
# cost (2-4 s here); after it, a worker's warm-up dry run takes ~25 ms.
# Imports only: nothing has run on torch yet when the forkserver forks.  ckpt_core's
# own torch modules are cheap and load in the warm-up dry run (public names only).
PRELOAD: Final = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.models.llama.modeling_llama",  # the warm-up model's family
    "service.worker",
)

# The smallest config that exercises the whole path: validation, the model
# class lookup, the meta build, block discovery and hook installation.
WARM_UP_MODEL: Final = {
    "config": {
        "model_type": "llama",
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 64,
    }
}


# Validated models an estimate worker keeps (by canonical JSON): a model asked about
# again with another workload skips building the transformers config (1-2 ms).
MODEL_CACHE_SIZE: Final = 256
MAX_MODEL_KEY_CHARS: Final = 16 * 1024  # an inline 70B config is ~0.5 KiB
_models: LRUCache[str, ModelConfig] = LRUCache(MODEL_CACHE_SIZE)


def warm_up() -> None:
    """One tiny dry run: imports torch, transformers and the modules a dry run uses."""
    dry_run(WARM_UP_MODEL, "selective")


def warm_up_estimates() -> None:
    """One tiny estimate: imports the config classes and the memory model."""
    make_plan("auto", gpu="A100-80GB", model=WARM_UP_MODEL, workload={"seq_len": 128})
    _models.clear()


def as_data(job: Callable[[], Any]) -> dict[str, Any]:
    """``job()`` as data, exactly one key of:

    - ``result``: what it returned;
    - ``error``: the ckpt_core error (bad input; it pickles with its ``field``);
    - ``unavailable``: a feature this build lacks (NotImplementedError's text);
    - ``failed``: anything else, as text, with ``traceback`` for the service log.
    """
    try:
        return {"result": job()}
    except CkptError as exc:
        return {"error": exc}
    except NotImplementedError as exc:
        return {"unavailable": str(exc)}
    except Exception as exc:
        return {"failed": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


def run_job(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`dry_run(**kwargs)`'s report dict, as data."""
    return as_data(lambda: dry_run(**kwargs).to_dict())


def plan_job(request: dict[str, Any]) -> dict[str, Any]:
    """`make_plan`'s answer as a dict, as data, for ``request``: `make_plan`'s
    keyword arguments, the model as its mapping (or None) and ``limits``."""

    def plan() -> dict[str, Any]:
        kwargs = dict(request)
        model, limits = kwargs.pop("model"), kwargs.pop("limits")
        config = validated_model(model, limits) if model is not None else None
        return make_plan(**kwargs, model=config).to_dict()

    return as_data(plan)


def validated_model(model: dict[str, Any], limits: ConfigLimits) -> ModelConfig:
    """`load_model_config`, remembered per model (ckpt_core only reads a `ModelConfig`)."""
    key = json.dumps(model, sort_keys=True, separators=(",", ":"))
    config = _models.get(key)
    if config is None:
        config = load_model_config(model, limits=limits)  # raises before it is kept
        if len(key) <= MAX_MODEL_KEY_CHARS:
            _models[key] = config
    return config
