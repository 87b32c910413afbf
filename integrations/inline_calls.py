"""Which env calls an env server runs inline on its event loop, and the watchdog that keeps that honest.

Why inline: a thread-pool hop (submit, wake a worker, pass the GIL back and forth, wake the loop) costs more
than a cheap env's whole step, which takes tens of microseconds; profiled, it was most of the gap between the
HTTP env server and a bare app (docs/serving.md#inline-calls). Why not always: an inline call blocks every
other client until it returns, and nothing can stop it early.

So each kind of call (an env id and ``reset`` or ``step``) starts on the pool, timed. After ``promote_after``
pooled calls in a row within ``budget_s`` (CPU and wall time) it runs inline. Inline calls over
``10 * budget_s`` count strikes (fast ones wear them off); three demote the kind back to the pool, and it has
to earn twice the streak to come back; after ``max_demotions`` it stays on the pool. The watchdog thread notices an inline call still running after ``warn_after_s``: it demotes its
kind at once and logs which session blocked the loop, so an operator can see it; the call itself still runs
to the end (a running call cannot be stopped), and the server then answers 504 if it overran the timeout.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger("rl_llm.integrations.env_server")
Kind = tuple[str, str]  # (env id, "reset" | "step")
T = TypeVar("T")


@dataclass
class _Record:
    streak: int = 0
    strikes: float = 0.0
    demotions: int = 0
    inline: bool = False


def timed(fn: Callable[[], T]) -> tuple[T, float, float]:
    """Run ``fn`` (on a worker) and say how long it took there, wall and CPU (the hop not counted)."""
    start, cpu = time.perf_counter(), time.thread_time()
    result = fn()
    return result, time.perf_counter() - start, time.thread_time() - cpu


class InlinePolicy:
    """Per call kind: inline or pool. Used from the event loop only, except the watchdog's demotion."""

    def __init__(self, budget_s: float = 0.001, promote_after: int = 16, max_demotions: int = 8,
                 warn_after_s: float = 1.0) -> None:  # fmt: skip
        self.budget_s = budget_s
        self.promote_after = promote_after
        self.max_demotions = max_demotions
        self.warn_after_s = warn_after_s
        self.demotions = 0  # total, for the server's /stats
        self._records: dict[Kind, _Record] = {}
        self._running: tuple[float, Kind, str] | None = None  # the inline call now blocking the loop
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None

    def inline(self, kind: Kind) -> bool:
        record = self._records.get(kind)
        return self.budget_s > 0 and record is not None and record.inline

    def pooled(self, kind: Kind, elapsed: float, cpu: float | None = None) -> None:
        """Record a pooled call's wall and CPU time, measured on its worker (the hop not counted). Fast means
        within the budget in both: wall time too, so a call that waits (a sandbox's shell answering in a few
        milliseconds with next to no CPU) never goes inline, where its waiting would stall every client."""
        if self.budget_s <= 0:
            return
        cpu = elapsed if cpu is None else cpu
        record = self._records.setdefault(kind, _Record())
        fast = cpu <= self.budget_s and elapsed <= self.budget_s
        record.streak = record.streak + 1 if fast else 0
        if record.demotions < self.max_demotions and record.streak >= self.promote_after * 2**record.demotions:
            record.inline = True

    def ran_inline(self, kind: Kind, elapsed: float) -> None:
        """Judge an inline call: over ``10 * budget_s`` is a strike, a call within it takes back 1/32 of one, and
        three strikes demote the kind. Not one strike: on a busy machine the loop thread is now and then
        preempted mid-call, which says nothing about the env; an env that is really slow strikes again at once."""
        record = self._records.setdefault(kind, _Record())
        if elapsed > 10 * self.budget_s:
            record.strikes += 1.0
            if record.strikes >= 3.0:
                self._demote(kind)
        elif record.strikes:
            record.strikes = max(0.0, record.strikes - 1 / 32)

    def _demote(self, kind: Kind) -> None:
        record = self._records.setdefault(kind, _Record())
        if record.inline:
            record.inline, record.streak, record.strikes = False, 0, 0.0
            record.demotions += 1
            self.demotions += 1

    def run(self, kind: Kind, session_id: str, fn: Callable[[], T]) -> tuple[T, float]:
        """Run ``fn`` inline, watched, and judge it; returns its result and wall time."""
        self._ensure_watchdog()
        start = time.perf_counter()  # wall time only: a CPU clock or getrusage is a syscall on every call
        self._running = (start, kind, session_id)
        try:
            result = fn()
        finally:
            self._running = None
        elapsed = time.perf_counter() - start
        self.ran_inline(kind, elapsed)
        return result, elapsed

    def _ensure_watchdog(self) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch_loop, name="rl-llm-inline-watchdog", daemon=True)
            self._watchdog.start()

    def _watch_loop(self) -> None:
        warned: tuple[float, Kind, str] | None = None
        while not self._stop.wait(min(0.25, self.warn_after_s / 4)):
            running = self._running
            if running is None or running is warned or time.perf_counter() - running[0] < self.warn_after_s:
                continue
            warned = running
            self._demote(running[1])  # a dict lookup and three stores; the loop thread is stuck in the env call
            log.warning("env call %s of session %s has blocked the event loop for over %.1fs; "
                        "%s calls now run on the worker pool", running[1][1], running[2], self.warn_after_s,
                        running[1][0])  # fmt: skip

    def close(self) -> None:
        self._stop.set()


class LoopBatch:
    """Inline calls of many connections, run back to back in one event-loop callback instead of each in its own
    connection's task: at most ``cap`` per callback, in the order they came, the rest in the next callback.

    Why: under load an env's step costs the server about 2.5x its cost in a tight loop (docs/serving.md): between
    two steps the loop runs a whole message's network and JSON code, and the env's code is cold again. Run back
    to back, the steps of the connections whose messages arrived together stay warm. Measured on the env server's
    WebSocket endpoint, 64 and 256 clients: server CPU per call 57-64 -> 50-58 us, p99 lower (docs/serving.md).
    The cap bounds what one callback holds the loop for (unbounded, p99 at 256 clients doubled).

    A call whose waiter was cancelled before its turn (its connection went away) is not run at all: the session
    it belongs to may be closing, and nobody waits for its answer.
    """

    def __init__(self, cap: int = 32) -> None:
        self.cap = cap
        self._pending: list[tuple[Callable[[], object], asyncio.Future]] = []

    def run(self, call: Callable[[], T]) -> asyncio.Future[T]:
        """Queue ``call`` for the loop's next batch; await the result (or its exception)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._pending.append((call, future))
        if len(self._pending) == 1:
            loop.call_soon(self._run_batch)
        return future

    def _run_batch(self) -> None:
        batch, self._pending = self._pending[: self.cap], self._pending[self.cap :]
        if self._pending:  # after the connections this batch answers have had their turn
            asyncio.get_running_loop().call_soon(self._run_batch)
        for call, future in batch:
            if future.cancelled():
                continue
            try:
                result = call()
            except StopIteration as error:  # a future refuses it (PEP 479's rule): the same error, wrapped
                future.set_exception(RuntimeError(f"StopIteration: {error}"))
            except Exception as error:  # handed to the waiter, which turns it into its HTTP answer
                future.set_exception(error)
            else:
                future.set_result(result)
