"""The service-wide state: built in the lifespan, reached through dependencies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, TypedDict

from fastapi import Depends, Request

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


async def service_state(request: Request) -> ServiceState:
    """The app's `ServiceState` (async: FastAPI runs a plain `def` dependency in a thread)."""
    state: ServiceState = request.state.service
    return state


State = Annotated[ServiceState, Depends(service_state)]
