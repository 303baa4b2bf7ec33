"""Deadlines for many concurrent awaits, checked together by one periodic timer.

`asyncio.timeout` around each request body read schedules a timer handle and
cancels it again, per request: ~6 us in a tight loop and ~14 us a ``/resolve``
in the app (paired, with and without it) - the largest single cost the service
added over a bare FastAPI endpoint, for a limit that almost never fires.  Here
a read enters its task and deadline in a dict and leaves when it is done (a
fraction of a microsecond); one timer, armed while reads are pending, runs
every tenth of the time limit and cancels those past their deadline, which then
raise `TimeoutError` as `asyncio.timeout` would.  The price: a read is cut off
between `timeout_s` and 1.1 x `timeout_s` after it started, not at the instant.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, Final, TypeVar

T = TypeVar("T")

# The timer's period as a fraction of the time limit: how late a cut-off may be.
SWEEP_FRACTION: Final = 0.1


class DeadlineSweep:
    """Bound awaits in time (`run`), with one timer for all of those pending.

    An instance may serve several event loops in turn (a test client starts one
    per session); its timer follows the loop of the latest read.
    """

    def __init__(self, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        self.timeout_s = timeout_s
        self._period = timeout_s * SWEEP_FRACTION
        self._deadlines: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    async def run(self, awaitable: Awaitable[T]) -> T:
        """`awaitable`'s result, or `TimeoutError` once it has waited past `timeout_s`.

        A cancellation from anywhere else still reaches the caller as
        `CancelledError`, as with `asyncio.timeout`.
        """
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("DeadlineSweep.run must be awaited in a task")
        loop = task.get_loop()
        self._deadlines[task] = loop.time() + self.timeout_s
        if self._timer is None or self._timer_loop is not loop:
            self._arm(loop)
        try:
            return await awaitable
        except asyncio.CancelledError:
            if task in self._expired:
                self._expired.discard(task)
                # Zero: ours was the only cancellation asked; more: someone else's too.
                if task.uncancel() == 0:
                    raise TimeoutError from None
            raise
        finally:
            del self._deadlines[task]
            self._expired.discard(task)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer_loop = loop
        self._timer = loop.call_later(self._period, self._sweep, loop)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Cancel the reads past their deadline; re-arm while any is pending."""
        self._timer = None
        if not self._deadlines:
            return
        now = loop.time()
        for task, deadline in self._deadlines.items():
            # Once, as asyncio.timeout: a read that swallows the cancel is not hit again.
            if deadline <= now and task not in self._expired:
                self._expired.add(task)
                task.cancel()  # only schedules: the dict is not changed while iterated
        self._arm(loop)
