"""HTTP client for the ckpt-advisor service, with a local fallback.

A worker asks the service so that one place decides (and can be changed
without redeploying workers); when the service cannot be reached it must not
stall or die, so the client answers from ckpt_core locally - the same code the
service runs - and says so (`Answer.source == "fallback"`).

Rules:

- Retries are bounded: connection errors, timeouts, 5xx and 429 are retried
  ``retries`` times with exponential backoff; a ``Retry-After`` header is
  honoured (a wait longer than ``max_wait`` ends the retries at once instead of
  retrying too early).
- 4xx answers are the caller's mistake: they raise the matching ckpt_core
  error class (`InvalidTierError`, `UnknownGpuError`, ...) and never fall back;
  501 (a dry-run feature the service lacks) raises `NotImplementedError`.
- The worker's transformers version decides which TrainingArguments names are
  valid on the worker, so the client sends it (the installed one) when the
  caller does not; the fallback uses the same version, so its answer equals
  the service's.

httpx is imported when a client is created, never by ``import ckpt_core``.
"""

from __future__ import annotations

import email.utils
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from ckpt_core._errors import CkptError
from ckpt_core._plan import ASSUMED_TRANSFORMERS_VERSION, Plan, make_plan
from ckpt_core._planning.training_args import installed_transformers_version
from ckpt_core._seed_api import describe_tier

if TYPE_CHECKING:
    import httpx

    from ckpt_core._dry_run import DryRunReport

log = logging.getLogger(__name__)

T = TypeVar("T")
Source = Literal["service", "fallback"]


class ServiceRequestError(CkptError, ValueError):
    """A 4xx from the service whose error code has no ckpt_core class (e.g. a size limit)."""

    code = "service_request_error"

    def __init__(self, message: str, *, field: str | None = None, status: int = 400) -> None:
        super().__init__(message, field=field)
        self.status = status


class ServiceUnavailableError(CkptError, ConnectionError):
    """The service could not answer after the retries, and no fallback was possible."""

    code = "service_unavailable"


@dataclass(frozen=True, slots=True)
class Answer(Generic[T]):
    """A client answer: the same object the local API returns, and where it came from.

    ``value`` is a `Plan`, a `DryRunReport` or a description string;
    ``source`` is ``"service"`` or ``"fallback"`` (computed locally because
    the service could not be reached - ``fallback_reason`` says why).
    """

    value: T
    source: Source
    fallback_reason: str | None = None


class _UnreachableError(Exception):
    """Internal: every attempt failed in a retryable way; carries the last reason."""


def _error_classes() -> dict[str, type[CkptError]]:
    """Every ckpt_core error class by its ``code`` (the service's ``error`` field)."""
    classes: dict[str, type[CkptError]] = {}
    pending: list[type[CkptError]] = [CkptError]
    while pending:
        cls = pending.pop()
        classes.setdefault(cls.code, cls)
        pending.extend(cls.__subclasses__())
    return classes


def retry_after_seconds(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP date)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None  # unparseable: fall back to our own backoff
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def _wire_form(data: dict[str, Any]) -> dict[str, Any]:
    """What `data` looks like after a trip through JSON (tuples become lists, ...)."""
    return json.loads(json.dumps(data))


class CkptClient:
    """Ask the service for plans, descriptions and dry runs; fall back to local answers.

    ``timeout`` is per request (seconds); ``retries`` extra attempts after the
    first; the n-th retry waits ``backoff * 2**n`` seconds unless the service
    sent ``Retry-After``; waits over ``max_wait`` end the retries.
    ``transport`` is passed to httpx (tests, proxies, unix sockets).
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_wait: float = 30.0,
        fallback: bool = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        import httpx

        _check_settings(base_url, timeout, retries, backoff, max_wait)
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.backoff = backoff
        self.max_wait = max_wait
        self.fallback = fallback
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport)

    def __enter__(self) -> CkptClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def resolve(
        self,
        tier: object,
        gpu_memory_gb: float | None = None,
        *,
        gpu: str | None = None,
        transformers_version: str | None = None,
        model: Mapping[str, Any] | None = None,
        workload: Mapping[str, Any] | None = None,
    ) -> Answer[Plan]:
        """`make_plan` through the service (``POST /resolve``)."""
        version = transformers_version or _worker_transformers_version()
        # tier always goes: the service requires it (null is an explicit "off").
        body = {"tier": tier} | _drop_none(
            gpu_memory_gb=gpu_memory_gb,
            gpu=gpu,
            transformers_version=version,
            model=model,
            workload=workload,
        )
        return self._ask(
            lambda: self._send("POST", "/resolve", json=body),
            parse=Plan.from_dict,
            local=lambda: local_plan(
                tier,
                gpu_memory_gb,
                gpu=gpu,
                transformers_version=version,
                model=model,
                workload=workload,
            ),
        )

    def describe(
        self, tier: object, gpu_memory_gb: float | None = None, *, gpu: str | None = None
    ) -> Answer[str]:
        """`describe_tier` through the service (``GET /describe``)."""
        params = _drop_none(tier=tier, gpu_memory_gb=gpu_memory_gb, gpu=gpu)
        return self._ask(
            lambda: self._send("GET", "/describe", params=params),
            parse=_description,
            local=lambda: describe_tier(tier, gpu_memory_gb, gpu=gpu),  # type: ignore[arg-type]
        )

    def dry_run(
        self,
        model: Mapping[str, Any],
        tier: object,
        gpu_memory_gb: float | None = None,
        *,
        gpu: str | None = None,
        transformers_version: str | None = None,
        measure: Mapping[str, Any] | None = None,
    ) -> Answer[DryRunReport]:
        """`dry_run` through the service (``POST /dry-run``); the fallback needs torch."""
        from ckpt_core._dry_run import dry_run

        version = transformers_version or _worker_transformers_version()
        body = {"tier": tier} | _drop_none(
            model=model,
            gpu_memory_gb=gpu_memory_gb,
            gpu=gpu,
            transformers_version=version,
            measure=measure,
        )
        return self._ask(
            lambda: self._send("POST", "/dry-run", json=body),
            parse=_dry_run_report,
            local=lambda: dry_run(
                model, tier, gpu_memory_gb, gpu=gpu, transformers_version=version, measure=measure
            ),
        )

    def _ask(
        self,
        request: Callable[[], httpx.Response],
        *,
        parse: Callable[[Any], T],
        local: Callable[[], T],
    ) -> Answer[T]:
        """Send, raise 4xx as ckpt_core errors, parse 2xx, fall back when unreachable."""
        try:
            response = request()
            _raise_client_error(response)
            return Answer(_parse(response, parse), "service")
        except _UnreachableError as exc:
            reason = str(exc)
        if not self.fallback:
            raise ServiceUnavailableError(f"service {self.base_url} unavailable: {reason}")
        log.warning("ckpt service %s unavailable (%s): answering locally", self.base_url, reason)
        return Answer(_as_wire(local(), parse), "fallback", fallback_reason=reason)

    def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
    ) -> httpx.Response:
        """One request with bounded retries; a non-retryable response is returned as is."""
        import httpx

        reason = "no attempt made"
        for attempt in range(self.retries + 1):
            retry_after: float | None = None
            try:
                response = self._http.request(method, path, json=json, params=params)
            except httpx.TransportError as exc:  # connect / read errors and timeouts
                reason = f"{type(exc).__name__}: {exc}"
            else:
                if not _retryable(response.status_code):
                    return response
                reason = f"HTTP {response.status_code} from {method} {path}"
                retry_after = retry_after_seconds(response.headers.get("Retry-After"))
            if attempt == self.retries:
                break
            wait = retry_after if retry_after is not None else self.backoff * 2**attempt
            if wait > self.max_wait:
                reason += f" (Retry-After {wait:g}s exceeds max_wait {self.max_wait:g}s)"
                break
            time.sleep(wait)
        raise _UnreachableError(reason)


def local_plan(
    tier: object,
    gpu_memory_gb: object = None,
    *,
    gpu: str | None = None,
    transformers_version: str | None = None,
    model: Mapping[str, Any] | None = None,
    workload: Mapping[str, Any] | None = None,
) -> Plan:
    """`make_plan` with ``model`` / ``workload`` passed through only when given."""
    extra = _drop_none(model=model, workload=workload)
    return make_plan(
        tier, gpu_memory_gb, gpu=gpu, transformers_version=transformers_version, **extra
    )


def _worker_transformers_version() -> str:
    return installed_transformers_version() or ASSUMED_TRANSFORMERS_VERSION


def _drop_none(**values: Any) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def _check_settings(
    base_url: object, timeout: float, retries: int, backoff: float, max_wait: float
) -> None:
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 10:
        raise ValueError(f"retries must be an integer from 0 to 10, got {retries!r}")
    for name, value in (("timeout", timeout), ("backoff", backoff), ("max_wait", max_wait)):
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a number >= 0 (seconds), got {value!r}")
    if timeout == 0:
        raise ValueError("timeout must be > 0 seconds: 0 would never wait for an answer")


def _retryable(status: int) -> bool:
    """5xx and 429 may pass; 501 (a feature this service lacks) will not."""
    return status == 429 or (status >= 500 and status != 501)


def _raise_client_error(response: httpx.Response) -> None:
    """Turn a 4xx into the ckpt_core error class its ``error`` code names (501: NotImplemented)."""
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    detail = str(body.get("detail") or response.text or f"HTTP {response.status_code}")
    field = body.get("field") if isinstance(body.get("field"), str) else None
    if response.status_code == 501:
        raise NotImplementedError(detail)
    cls = _error_classes().get(str(body.get("error")))
    if cls is None or cls is CkptError:
        raise ServiceRequestError(detail, field=field, status=response.status_code)
    raise cls(detail, field=field)


def _parse(response: httpx.Response, parse: Callable[[Any], T]) -> T:
    """Decode a 2xx; a body that is not the expected object is a broken service."""
    try:
        return parse(response.json())
    except (ValueError, TypeError, KeyError) as exc:
        raise _UnreachableError(
            f"invalid answer from {response.request.method} {response.request.url.path}: {exc}"
        ) from exc


def _description(data: Any) -> str:
    if isinstance(data, dict) and isinstance(data.get("description"), str):
        return data["description"]
    raise ValueError(f"expected an object with a 'description' string, got {data!r}")


def _dry_run_report(data: Any) -> DryRunReport:
    """A `DryRunReport` from its `to_dict` form (JSON has lists where it has tuples)."""
    from ckpt_core._dry_run import DryRunReport

    if not isinstance(data, dict):
        raise TypeError(f"expected a dry-run report object, got {data!r}")
    return DryRunReport(**{**data, "modules": tuple(data["modules"])})


def _as_wire(value: T, parse: Callable[[Any], T]) -> T:
    """A local answer decoded exactly as a service answer is: `to_dict` -> JSON -> ``parse``.

    So a fallback answer compares equal to the service's for the same request
    (JSON has lists, not tuples; floats round-trip exactly).
    """
    to_dict = getattr(value, "to_dict", None)
    if to_dict is None:
        return value  # a description string is its own wire form
    return parse(_wire_form(to_dict()))
