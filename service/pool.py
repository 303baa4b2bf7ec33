"""A small pool of pre-warmed worker processes with a queue limit and a time limit.

Why not `concurrent.futures.ProcessPoolExecutor`: it cannot kill one runaway
job.  Here every worker is one process with its own pipe; a job that overruns
its time limit gets its worker SIGKILLed and replaced, so a config that makes
a build spin never hangs the service, and the other workers keep serving.

Why processes at all: building a model on the meta device (a dry run) and
replaying a training step through the allocator model (an estimate with a
model) are pure Python and hold the GIL for tenths of a second to seconds; in
a thread they would stall the event loop that answers every other request.

Workers are forked from a forkserver that has already imported the preload
modules (torch, transformers), so a replacement starts in milliseconds instead
of re-importing for seconds.  Each worker runs `warm_up` once and reports ready
before it takes jobs.  Only the asyncio event loop calls into the pool.

Workers may run at a lower CPU priority (`cpu_priority`): when jobs and
requests compete for the same cores, the scheduler then favours the server's
event loop, and a job only runs slower - it is background work with a time
limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
from collections.abc import Callable, Coroutine, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Literal, TypeAlias

log = logging.getLogger(__name__)

CpuPriority: TypeAlias = Literal["normal", "low", "idle"]

# Seconds a worker may take to start and warm up before it counts as broken.
WARM_UP_TIMEOUT_S = 120.0


class PoolBusyError(Exception):
    """Every worker is busy and the queue is full: the caller should retry later."""


class JobTimeoutError(Exception):
    """A job ran past the time limit; its worker was killed and is being replaced."""


class WorkerCrashedError(Exception):
    """A worker died while running a job (killed, out of memory, segfault)."""


class WorkerStartError(Exception):
    """A worker could not start or warm up; the message says why."""


# Why a worker may die before it is ready: multiprocessing imports the main
# module in every worker, so a script that builds (and starts) the app at module
# level runs again in each worker.
MAIN_GUARD_HINT = (
    "if the app is started from a script, that script must create and run it under "
    '`if __name__ == "__main__":` - every worker process imports the main module '
    "(multiprocessing forkserver)"
)


class WorkerPool:
    """Run `job(payload)` in one of `size` worker processes; see the module docstring.

    `name` says what the workers run in messages and process names
    (``dry-run``, ``estimate``).  `job` and `warm_up` must be module-level
    functions (they are pickled by name).  At most `queue_limit` callers wait
    for a free worker; the next one gets `PoolBusyError`.  `timeout_s` bounds
    one job's run time.  `cpu_priority` is the workers' scheduling class (see
    `set_cpu_priority`).
    """

    def __init__(
        self,
        *,
        name: str,
        job: Callable[[Any], Any],
        warm_up: Callable[[], None],
        size: int,
        queue_limit: int,
        timeout_s: float,
        preload: Sequence[str] = (),
        cpu_priority: CpuPriority = "normal",
    ) -> None:
        self.name = name
        self._job = job
        self._warm_up = warm_up
        self._cpu_priority = cpu_priority
        self.size = size
        self.queue_limit = queue_limit
        self.timeout_s = timeout_s
        self._context = multiprocessing.get_context("forkserver")
        # The forkserver is shared by the whole process: setting the same list
        # twice (several apps in one test session) is harmless.
        self._context.set_forkserver_preload(list(preload))
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._workers: set[_Worker] = set()  # warm workers, idle or busy
        self._background: set[asyncio.Task[None]] = set()
        self._starting: set[_Worker] = set()  # forked, not yet warm
        self._waiting = 0
        self._closed = False
        self.ready = False
        self.last_start_error: str | None = None

    @property
    def queue_depth(self) -> int:
        """Callers waiting for a free worker."""
        return self._waiting

    @property
    def busy(self) -> int:
        """Workers running a job right now."""
        return len(self._workers) - self._idle.qsize()

    async def start(self) -> None:
        """Start and warm up every worker; `ready` turns true when all are warm."""
        await asyncio.gather(*(self._add_worker_until_started() for _ in range(self.size)))
        self.ready = not self._closed

    async def run(self, payload: Any) -> Any:
        """Run one job; raise `PoolBusyError`, `JobTimeoutError` or `WorkerCrashedError`."""
        if self._closed:
            raise WorkerCrashedError("the worker pool is shut down")
        worker = await self._take_worker()
        try:
            worker.conn.send(payload)
            result = await _receive(worker.conn, self.timeout_s)
        except TimeoutError:
            self._replace(worker, reason="time limit")
            raise JobTimeoutError(
                f"the {self.name} job took longer than {self.timeout_s:g} s and was stopped"
            ) from None
        except (EOFError, OSError) as exc:
            self._replace(worker, reason=f"crashed: {exc!r}")
            raise WorkerCrashedError(f"the {self.name} worker died while running the job") from exc
        except BaseException:
            # Cancelled while the job runs: its answer would reach the next
            # caller, so the worker cannot go back to the idle queue.
            self._replace(worker, reason="cancelled")
            raise
        self._idle.put_nowait(worker)
        return result

    async def _take_worker(self) -> _Worker:
        """An idle worker now, or after waiting in the bounded queue."""
        try:
            return self._idle.get_nowait()
        except asyncio.QueueEmpty:
            pass
        if self._waiting >= self.queue_limit:
            raise PoolBusyError(
                f"all {self.size} {self.name} workers are busy and {self._waiting} requests "
                "are queued"
            )
        self._waiting += 1
        try:
            # Waiting is bounded too: with every worker stuck or restarting,
            # a caller hears "busy" instead of hanging.
            return await asyncio.wait_for(self._idle.get(), self.timeout_s)
        except TimeoutError:
            raise PoolBusyError(
                f"no {self.name} worker became free within {self.timeout_s:g} s"
            ) from None
        finally:
            self._waiting -= 1

    async def close(self) -> None:
        """Stop every worker, started or starting (SIGKILL: jobs are read-only).

        Kills run in threads, so that requests being cancelled with the server
        still get their answers out meanwhile; here, when the loop's executor is
        already shut down.
        """
        self._closed = True
        self.ready = False
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for worker in [*self._workers, *self._starting]:
            try:
                await asyncio.to_thread(worker.abandon)
            except RuntimeError:  # cannot schedule new futures after shutdown
                worker.abandon()
        self._workers.clear()
        self._starting.clear()

    def _replace(self, worker: _Worker, *, reason: str) -> None:
        """Kill `worker` and start a fresh one in the background."""
        log.warning("replacing %s worker pid %s: %s", self.name, worker.process.pid, reason)
        self._workers.discard(worker)
        self._in_background(asyncio.to_thread(worker.kill))
        if not self._closed:
            self._in_background(self._add_worker_until_started())

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` as a task the pool keeps (for `close`) and whose failure is logged."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s pool background task failed", self.name, exc_info=task.exception())

    async def _add_worker_until_started(self) -> None:
        """`_add_worker`, retried with backoff (1 s doubling to 30 s) until the pool closes.

        A worker that cannot start (its forkserver died, warm-up raised) is
        retried rather than leaving the pool short for good; `last_start_error`
        tells /readyz why it is not ready meanwhile.  Each distinct failure is
        logged once (with its traceback when it is not one of ours), not at
        every retry.
        """
        delay = 1.0
        while not self._closed:
            try:
                await self._add_worker()
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                if error != self.last_start_error:
                    log.error(
                        "%s worker failed to start: %s; retrying with backoff "
                        "(1 s doubling to 30 s), /readyz answers 503 meanwhile",
                        self.name,
                        error,
                        exc_info=not isinstance(exc, WorkerStartError),
                    )
                self.last_start_error = error
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
            else:
                self.last_start_error = None
                return

    async def _add_worker(self) -> None:
        """Fork one worker, wait for its warm-up, then make it available."""
        parent_conn, child_conn = self._context.Pipe()
        process = self._context.Process(
            target=_serve,
            args=(child_conn, self._job, self._warm_up, self._cpu_priority),
            name=f"ckpt-{self.name}",
            daemon=True,
        )
        worker = _Worker(process, parent_conn)
        self._starting.add(worker)
        try:
            # The first start launches the forkserver, which imports the preload
            # modules before it answers: seconds, so not on the event loop.
            await asyncio.to_thread(worker.start)
            child_conn.close()
            try:
                status = await _receive(parent_conn, WARM_UP_TIMEOUT_S)
            except EOFError:
                process.join(timeout=5)
                raise WorkerStartError(
                    f"the {self.name} worker exited before it was ready (exit code "
                    f"{process.exitcode}); {MAIN_GUARD_HINT}"
                ) from None
            except TimeoutError:
                raise WorkerStartError(
                    f"the {self.name} worker was not ready within {WARM_UP_TIMEOUT_S:g} s"
                ) from None
        except BaseException:
            worker.abandon()
            raise
        finally:
            self._starting.discard(worker)
        if status != "ready" or self._closed:
            worker.kill()
            if status != "ready":
                raise WorkerStartError(f"the {self.name} worker failed to warm up: {status}")
            return
        log.info("%s worker pid %s ready", self.name, process.pid)
        self._workers.add(worker)
        self._idle.put_nowait(worker)


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, process: BaseProcess, conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self._abandoned = False

    def start(self) -> None:
        """Start the process (blocking: call in a thread).

        A start outlives a cancelled wait for it (a thread cannot be stopped):
        when the worker was abandoned meanwhile, nobody else will kill it.
        """
        self.process.start()
        if self._abandoned:
            self.kill()

    def abandon(self) -> None:
        """Kill the process now if it runs, or as soon as its start returns."""
        self._abandoned = True
        self.kill()

    def kill(self) -> None:
        """SIGKILL the process, reap it, close the pipe (blocking: call in a thread)."""
        if self.process.pid is not None:  # started
            with contextlib.suppress(OSError, ValueError):
                self.process.kill()
                self.process.join(timeout=10)
        self.conn.close()


async def _receive(conn: Connection, timeout_s: float) -> Any:
    """Wait (without blocking the loop) until `conn` is readable, then read one message.

    EOF (the worker died) also makes the pipe readable; `recv` then raises
    `EOFError`.
    """
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()

    def on_readable() -> None:
        if not readable.done():
            readable.set_result(None)

    fd = conn.fileno()
    loop.add_reader(fd, on_readable)
    try:
        await asyncio.wait_for(readable, timeout_s)
    finally:
        loop.remove_reader(fd)
    return conn.recv()


def set_cpu_priority(priority: CpuPriority) -> None:
    """Lower this process's CPU priority: ``normal`` keeps it, ``low`` is nice +10,
    ``idle`` is Linux's SCHED_IDLE.

    Nice +10 still gets a time slice whenever it is runnable, so a request can
    wait behind one (milliseconds).  SCHED_IDLE runs only on CPU time no other
    task wants, and a waking request handler preempts it at once; the price is
    that a dry run crawls while the cores are saturated (its time limit still
    applies).  Where SCHED_IDLE does not exist, ``idle`` is the lowest nice (+19).
    """
    if priority == "low":
        os.nice(10)
    elif priority == "idle":
        if hasattr(os, "SCHED_IDLE"):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        else:
            os.nice(19)


def _serve(
    conn: Connection, job: Callable[[Any], Any], warm_up: Callable[[], None], priority: CpuPriority
) -> None:
    """Worker main loop: warm up, say ready, then answer jobs until the pipe closes.

    `job` must not raise (it returns its errors as data); anything that still
    escapes ends the worker, which the parent sees as a crash.
    """
    # Ctrl-C in a terminal reaches the whole process group: the parent decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    set_cpu_priority(priority)
    try:
        warm_up()
    except Exception as exc:
        conn.send(f"{type(exc).__name__}: {exc}")
        return
    conn.send("ready")
    while True:
        try:
            payload = conn.recv()
        except EOFError:
            return
        conn.send(job(payload))
