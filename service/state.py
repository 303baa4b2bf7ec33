"""The service-wide state: built in the lifespan, reached through the request's lifespan state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from fastapi import Request

from service.dry_runs import DryRunner
from service.metrics import Metrics
from service.plans import Planner
from service.settings import Settings


@dataclass(frozen=True, slots=True)
class ServiceState:
    """What every request of one app shares."""

    settings: Settings
    metrics: Metrics
    planner: Planner
    dry_runner: DryRunner


class LifespanState(TypedDict):
    """The lifespan's state (Starlette copies it into every request's ``request.state``)."""

    service: ServiceState


def service_state(request: Request) -> ServiceState:
    """The app's `ServiceState`, from the lifespan state Starlette copies into every request.

    A plain call, not a FastAPI dependency: resolving a sub-dependency cost about
    70,000 instructions a request (callgrind), 15% of a whole bare FastAPI POST.
    """
    state: ServiceState = request.state.service
    return state
