"""Query worker processes, so that a query can always be stopped: the parent's side of ``query_worker.py``.

SQLite's progress handler (the timeout in ``sqlite_guard.py``) runs only between virtual-machine instructions,
and some built-ins are superlinear on long strings (``trim``, ``instr``, ``LIKE``, ``printf`` widths): one call
can run for hours. So every query runs in a worker process, and the parent waits for the answer only until a
hard deadline (the query's timeout plus a grace of ``max(1 s, 0.25 * timeout)``); past it the worker is killed
(SIGKILL, reaped) and the next query starts a fresh one. Killing loses nothing: the worker only reads.

One ``WorkerPool`` per process (``POOL``) is shared by every ``ReadOnlyDatabase``: a query checks a worker out
under a lock and returns it afterwards, and any worker serves any database file. Workers start lazily, at most
``max_workers`` run at once (further callers wait for one to come back), and idle ones are kept for the next
query or episode while any database is open. When the last open database closes, every worker is closed; a
worker also exits when its stdin closes (the parent exited) or its parent process is gone. A forked child
forgets its parent's workers and starts its own.
"""

from __future__ import annotations

import atexit
import io
import os
import pickle
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rl_llm.envs.sql.query_worker import HEADER

WORKER_SCRIPT = Path(__file__).with_name("query_worker.py")


def hard_deadline_s(timeout_s: float) -> float:
    """Seconds the parent waits for an answer: the worker's own timeout answers first in all but the
    pathological cases, and the grace covers its start-up and sending a large result back."""
    return timeout_s + max(1.0, 0.25 * timeout_s)


class WorkerGone(Exception):
    """The worker exited, or sent something other than an answer, before answering."""


class WorkerOverran(Exception):
    """No answer came before the hard deadline."""


class _PlainValues(pickle.Unpickler):
    # Answers hold only tuples, lists, str, bytes, numbers and None; refuse anything that names a class.
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the query worker sent a {module}.{name}; only plain values are accepted")


class QueryWorker:
    """One worker process and its pipes."""

    def __init__(self) -> None:
        command = [sys.executable, "-I", "-S", str(WORKER_SCRIPT), str(os.getpid())]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def ask(self, request: tuple[Any, ...], deadline: float) -> tuple[Any, ...]:
        """The worker's answer to ``request``; raises WorkerOverran past ``deadline`` (monotonic)."""
        data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        stdin = self.process.stdin
        assert stdin is not None
        try:
            stdin.write(HEADER.pack(len(data)) + data)
            stdin.flush()
        except OSError as exc:  # BrokenPipeError: it exited before reading
            raise WorkerGone(self._gone_message()) from exc
        body = self._read(HEADER.unpack(self._read(HEADER.size, deadline))[0], deadline)
        try:
            return tuple(_PlainValues(io.BytesIO(body)).load())
        except (pickle.UnpicklingError, EOFError, TypeError, ValueError) as exc:
            raise WorkerGone(f"the query worker sent an invalid answer ({exc})") from exc

    def _read(self, size: int, deadline: float) -> bytes:
        stdout = self.process.stdout
        assert stdout is not None
        fd = stdout.fileno()
        poller = select.poll()  # not select.select: a server's descriptors can be numbered past 1024
        poller.register(fd, select.POLLIN)
        data = bytearray()
        while len(data) < size:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                raise WorkerOverran
            chunk = os.read(fd, min(size - len(data), 1 << 20))
            if not chunk:
                raise WorkerGone(self._gone_message())
            data += chunk
        return bytes(data)

    def _gone_message(self) -> str:
        try:
            code = self.process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return "the query worker stopped answering"
        return f"the query worker exited unexpectedly (exit code {code})"

    def close(self) -> None:
        # Killed rather than asked to stop: it holds only read-only connections, and this never waits on it.
        if self.alive():
            self.process.kill()
        self.process.wait()
        self.close_pipes()

    def close_pipes(self) -> None:
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:  # a request left unsent in the buffer of a worker that died: nothing to do
                pass


class WorkerPool:
    """Query workers shared by every open database of the process; see the module docstring."""

    def __init__(self, max_workers: int | None = None) -> None:
        self.max_workers = max_workers or max(2, os.cpu_count() or 2)
        self._condition = threading.Condition()
        self._idle: list[QueryWorker] = []
        self._busy = 0
        self._users = 0

    def register(self) -> None:
        """A database opened: keep idle workers from now on."""
        with self._condition:
            self._users += 1

    def unregister(self) -> None:
        """A database closed: with none left open, close the idle workers."""
        with self._condition:
            self._users -= 1
            idle, self._idle = (self._idle, []) if self._users <= 0 else ([], self._idle)
        for worker in idle:
            worker.close()

    def run(self, request: tuple[Any, ...], timeout_s: float) -> tuple[Any, ...] | None:
        """The answer to ``request``, or None when it overran the hard deadline and its worker was killed.

        A worker found dead (killed from outside, crashed) is replaced and the request sent once more.
        """
        for attempt in range(2):
            worker = self._checkout()
            usable = False
            try:
                answer = worker.ask(request, time.monotonic() + hard_deadline_s(timeout_s))
                usable = True
                return answer
            except WorkerOverran:
                return None
            except WorkerGone:
                if attempt:
                    raise
            finally:
                self._checkin(worker, usable)
        raise AssertionError("unreachable")

    def _checkout(self) -> QueryWorker:
        with self._condition:
            while not self._idle and self._busy >= self.max_workers:
                self._condition.wait()
            self._busy += 1
            worker = self._idle.pop() if self._idle else None
        if worker is not None and worker.alive():
            return worker
        try:
            if worker is not None:
                worker.close()
            return QueryWorker()  # started outside the lock: other callers need not wait for it
        except BaseException:
            self._release()
            raise

    def _checkin(self, worker: QueryWorker, usable: bool) -> None:
        with self._condition:
            keep = usable and self._users > 0 and worker.alive()
            if keep:
                self._idle.append(worker)
            self._busy -= 1
            self._condition.notify()
        if not keep:
            worker.close()

    def _release(self) -> None:
        with self._condition:
            self._busy -= 1
            self._condition.notify()

    def worker_pids(self) -> list[int]:
        """Process ids of the idle workers (busy ones are in their callers' hands)."""
        with self._condition:
            return [worker.pid for worker in self._idle]

    def shutdown(self) -> None:
        """Close the idle workers (at exit; busy ones exit when this process's pipes close)."""
        with self._condition:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.close()

    def after_fork(self) -> None:
        # The workers belong to the parent: close only this child's copies of their pipes (a kept copy of a
        # stdin would stop the worker from seeing the parent close it) and start afresh.
        for worker in self._idle:
            worker.close_pipes()
        self._condition = threading.Condition()
        self._idle, self._busy = [], 0


POOL = WorkerPool()
atexit.register(POOL.shutdown)
os.register_at_fork(after_in_child=POOL.after_fork)
