"""Service settings from the environment: one prefix, ``CKPT_``, validated at startup.

Every field is an environment variable ``CKPT_<FIELD>`` (case-insensitive);
the config bounds are nested: ``CKPT_CONFIG_LIMITS__MAX_LAYERS=128``; lists
(auth tokens, CORS origins) are comma-separated.  A ``CKPT_*`` variable that
names no setting is an error: a typo must not silently leave a limit at its
default - nor an empty token list silently turn authentication off.
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from ckpt_core import ConfigLimits

ENV_PREFIX = "CKPT_"
_NESTED = "__"

# RFC 6750 b64token: what may follow "Bearer " in an Authorization header.
_BEARER_TOKEN: Final = re.compile(r"^[A-Za-z0-9._~+/-]+=*$")
# Shorter tokens can be guessed; 32 hex digits (`openssl rand -hex 16`) is the floor.
MIN_TOKEN_CHARS: Final = 32


def _comma_separated(value: Any, name: str) -> Any:
    """Split an environment string into its items.

    An empty item is an error, not skipped: ``CKPT_AUTH_TOKENS=""`` from a
    deployment whose secret is missing must not mean "no authentication".
    """
    if not isinstance(value, str):
        return value
    items = tuple(item.strip() for item in value.split(","))
    if not all(items):
        raise ValueError(f"{name} has an empty item: give comma-separated values or unset it")
    return items


def _is_origin(value: str) -> bool:
    """``scheme://host[:port]`` exactly as a browser sends it in ``Origin``."""
    try:
        parts = urlsplit(value)
        port_ok = parts.port is None or parts.port > 0  # .port raises on a bad port
    except ValueError:
        return False
    return (
        parts.scheme in ("http", "https")
        and bool(parts.hostname)
        and port_ok
        and f"{parts.scheme}://{parts.netloc}" == value
        and "@" not in parts.netloc
    )


class Settings(BaseSettings):
    """What an operator can tune; the defaults suit one small replica (2 CPUs)."""

    # hide_input_in_errors: a rejected auth token must not be echoed into the logs.
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=_NESTED,
        extra="forbid",
        frozen=True,
        hide_input_in_errors=True,
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
    # bench/http_load.py's saturation run (README, Performance) A/B'd the three:
    # /resolve's busy p99 stayed within noise of each other once the request
    # path was lean; "low" finished as many dry runs as "normal" and did best.
    dry_run_cpu_priority: Literal["normal", "low", "idle"] = Field(
        "low",
        description="CPU priority of the dry-run workers: normal, low (nice +10) or idle "
        "(SCHED_IDLE: only CPU time the server does not want).",
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
    # Estimates with a model replay a training step (tens of ms to a second of CPU):
    # in worker processes, so that the server's event loop keeps answering.
    estimate_workers: int = Field(
        1, ge=1, le=64, description="Worker processes that compute estimates with a model."
    )
    estimate_queue: int = Field(
        64, ge=0, description="Estimates that may wait for a free worker (429 beyond)."
    )
    estimate_timeout_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="Time limit of one estimate, and of its wait for a worker (504 / 429).",
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
    body_timeout_s: float = Field(
        10.0,
        gt=0,
        le=300,
        description="Time a client has to send its whole request body after the headers (408).",
    )
    auth_tokens: Annotated[tuple[SecretStr, ...], NoDecode] = Field(
        (),
        description="Bearer tokens accepted (comma-separated, several for rotation); "
        "empty: no authentication. /healthz and /readyz stay open.",
    )
    cors_origins: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description="Browser origins allowed by CORS (comma-separated, '*' for any); "
        "empty: no CORS headers.",
    )

    @field_validator("auth_tokens", mode="before")
    @classmethod
    def _split_tokens(cls, value: Any) -> Any:
        return _comma_separated(value, "auth_tokens")

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: Any) -> Any:
        return _comma_separated(value, "cors_origins")

    @field_validator("auth_tokens")
    @classmethod
    def _check_tokens(cls, tokens: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        for index, token in enumerate(tokens):
            secret = token.get_secret_value()
            # The message names the token's position, never its text.
            if not _BEARER_TOKEN.match(secret):
                raise ValueError(
                    f"auth token #{index + 1} has characters a Bearer token cannot carry "
                    "(allowed: letters, digits, - . _ ~ + / and trailing =)"
                )
            if len(secret) < MIN_TOKEN_CHARS:
                raise ValueError(
                    f"auth token #{index + 1} is {len(secret)} characters; "
                    f"use at least {MIN_TOKEN_CHARS} (e.g. openssl rand -hex 32)"
                )
        return tokens

    @field_validator("cors_origins")
    @classmethod
    def _check_origins(cls, origins: tuple[str, ...]) -> tuple[str, ...]:
        for origin in origins:
            if origin != "*" and not _is_origin(origin):
                raise ValueError(
                    f"CORS origin {origin!r} is not scheme://host[:port] (no path, no "
                    "trailing slash: browsers send it that way) or '*'"
                )
        return origins

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
