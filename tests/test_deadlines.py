"""DeadlineSweep: awaits cut off after their time limit, by one shared timer."""

from __future__ import annotations

import asyncio
import time

import pytest

from service.deadlines import SWEEP_FRACTION, DeadlineSweep

LIMIT_S = 0.2
# Scheduling slack on a shared machine, on top of the sweep's own lateness.
SLACK_S = 0.15


async def _never() -> None:
    await asyncio.Event().wait()


async def _after(seconds: float, value: str) -> str:
    await asyncio.sleep(seconds)
    return value


async def _time_out(sweep: DeadlineSweep) -> None:
    """`sweep` cuts off an await that never ends between its limit and a tenth more.

    The outer `wait_for` only keeps a broken sweep from hanging the test: its
    own TimeoutError comes too late to pass the time check.
    """
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(sweep.run(_never()), LIMIT_S * 5)
    elapsed = time.monotonic() - started
    assert LIMIT_S <= elapsed < LIMIT_S * (1 + SWEEP_FRACTION) + SLACK_S


def test_a_pending_await_is_cut_off_between_the_limit_and_a_tenth_more() -> None:
    asyncio.run(_time_out(DeadlineSweep(LIMIT_S)))


def test_an_await_done_in_time_returns_and_is_forgotten() -> None:
    """Once finished, the task is no longer watched: it may then wait as long as it likes."""
    sweep = DeadlineSweep(LIMIT_S)

    async def main() -> str:
        value = await sweep.run(_after(0.0, "body"))
        await asyncio.sleep(LIMIT_S * 3)  # not cancelled by a stale deadline
        return value

    assert asyncio.run(main()) == "body"


def test_only_the_late_of_concurrent_awaits_is_cut_off() -> None:
    sweep = DeadlineSweep(LIMIT_S)

    async def main() -> list[object]:
        reads = asyncio.gather(
            sweep.run(_never()),
            sweep.run(_after(LIMIT_S / 2, "quick")),
            sweep.run(_after(LIMIT_S * 0.8, "in time")),
            return_exceptions=True,
        )
        return await asyncio.wait_for(reads, LIMIT_S * 5)

    late, quick, in_time = asyncio.run(main())
    assert isinstance(late, TimeoutError)
    assert (quick, in_time) == ("quick", "in time")


def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    sweep = DeadlineSweep(LIMIT_S)

    async def main() -> None:
        task = asyncio.create_task(sweep.run(_never()))
        await asyncio.sleep(LIMIT_S / 4)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # and a later read on the same sweep still gets its own deadline
        assert await sweep.run(_after(0.0, "next")) == "next"
        await _time_out(sweep)

    asyncio.run(main())


def test_cut_off_and_cancelled_at_once_is_a_cancellation() -> None:
    """The sweep's cancel and another one both pending: the other one wins, as
    with asyncio.timeout (the caller is being torn down, not timed out)."""
    sweep = DeadlineSweep(LIMIT_S)
    period = LIMIT_S * SWEEP_FRACTION

    async def main() -> None:
        task = asyncio.create_task(sweep.run(_never()))
        await asyncio.sleep(0)  # the read starts: deadline at LIMIT_S, sweeps every period
        loop = asyncio.get_running_loop()
        # Hold the loop from LIMIT_S / 2 to past the deadline.  Then the sweep
        # that came due meanwhile runs and expires the read, and the outside
        # cancel, due a little later, runs right after it, before the task wakes.
        loop.call_later(LIMIT_S / 2, time.sleep, LIMIT_S * 0.7)
        loop.call_later(LIMIT_S / 2 + period * 1.5, task.cancel)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, LIMIT_S * 5)

    asyncio.run(main())


def test_the_sweep_follows_a_new_event_loop() -> None:
    """A test client runs a loop per session: a timer left on the old loop must not
    leave reads on the new one unwatched."""
    sweep = DeadlineSweep(LIMIT_S)
    asyncio.run(_time_out(sweep))

    async def leave_a_read_behind() -> None:
        asyncio.create_task(sweep.run(_never()))  # noqa: RUF006 - torn down with its loop
        await asyncio.sleep(0)

    asyncio.run(leave_a_read_behind())
    asyncio.run(_time_out(sweep))


@pytest.mark.parametrize("timeout_s", [0.0, -1.0, float("nan")])
def test_a_limit_that_is_not_positive_is_refused(timeout_s: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        DeadlineSweep(timeout_s)
