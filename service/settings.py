"""Service settings from the environment: one prefix, ``CKPT_``, validated at startup.

Every field is an environment variable ``CKPT_<FIELD>`` (case-insensitive);
the config bounds are nested: ``CKPT_CONFIG_LIMITS__MAX_LAYERS=128``.  A
``CKPT_*`` variable that names no setting is an error: a typo must not
silently leave a limit at its default.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ckpt_core._models import ConfigLimits

ENV_PREFIX = "CKPT_"
_NESTED = "__"


class Settings(BaseSettings):
    """What an operator can tune; the defaults suit one small replica (2 CPUs)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=_NESTED, extra="forbid", frozen=True
    )

    host: str = Field("127.0.0.1", description="Address uvicorn binds (0.0.0.0 in the image).")
    port: int = Field(8000, ge=1, le=65535, description="Port uvicorn binds.")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Level of the JSON logs on stderr."
    )
    max_body_bytes: int = Field(
        1 << 20, ge=1024, description="Largest request body accepted (413 above it)."
    )
    # One worker leaves a core of a 2-CPU replica to the server: /resolve
    # latency stays flat while models are built.  Raise it with the CPUs.
    dry_run_workers: int = Field(
        1, ge=1, le=64, description="Worker processes that run dry runs in parallel."
    )
    dry_run_queue: int = Field(
        8, ge=0, description="Dry runs that may wait for a free worker (429 beyond)."
    )
    dry_run_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Time limit of one dry run, and of its wait for a worker (504 / 429).",
    )
    dry_run_retry_after_s: int = Field(
        2, ge=1, description="Retry-After (seconds) sent with a 429."
    )
    dry_run_cache_size: int = Field(
        256, ge=0, description="Dry-run reports kept in the LRU cache (0: no cache)."
    )
    config_limits: ConfigLimits = Field(
        default_factory=ConfigLimits,
        description="Config bounds checked before anything is built "
        "(CKPT_CONFIG_LIMITS__MAX_LAYERS, ...).",
    )
    proxy_headers: bool = Field(
        True, description="Trust X-Forwarded-For / -Proto from forwarded_allow_ips."
    )
    forwarded_allow_ips: str = Field(
        "127.0.0.1", description="Comma-separated proxy addresses trusted for proxy headers."
    )
    graceful_shutdown_s: int = Field(
        20, ge=0, description="Seconds in-flight requests get after SIGTERM."
    )

    @model_validator(mode="after")
    def _no_unknown_variables(self) -> Settings:
        known = {name.upper() for name in type(self).model_fields}
        for variable in os.environ:
            upper = variable.upper()
            if not upper.startswith(ENV_PREFIX):
                continue
            name = upper.removeprefix(ENV_PREFIX).split(_NESTED, 1)[0]
            if name not in known:
                raise ValueError(
                    f"unknown setting {variable}; known: "
                    + ", ".join(sorted(ENV_PREFIX + k for k in known))
                )
        return self
