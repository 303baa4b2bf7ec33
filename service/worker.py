"""What runs inside a dry-run worker process (see `service.pool`).

`run_job` never raises: it returns the report, or the exception as data, so
one bad config costs one answer, not the worker.  Importing this module is
cheap (ckpt_core imports torch lazily); the worker imports torch when it
warms up.
"""

from __future__ import annotations

import traceback
from typing import Any, Final

from ckpt_core import CkptError, dry_run

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


def warm_up() -> None:
    """One tiny dry run: imports torch, transformers and the modules a dry run uses."""
    dry_run(WARM_UP_MODEL, "selective")


def run_job(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`dry_run(**kwargs)` as data, exactly one key of:

    - ``report``: the report dict;
    - ``error``: the ckpt_core error (bad input; it pickles with its ``field``);
    - ``unavailable``: a feature this build lacks (NotImplementedError's text);
    - ``failed``: anything else, as text, with ``traceback`` for the service log.
    """
    try:
        return {"report": dry_run(**kwargs).to_dict()}
    except CkptError as exc:
        return {"error": exc}
    except NotImplementedError as exc:
        return {"unavailable": str(exc)}
    except Exception as exc:
        return {"failed": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
