"""Host-side process helpers: spawning long-lived children safely, walking and signalling process trees."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any


def children(pid: int) -> list[int]:
    """Direct children of `pid` (all its threads), from /proc/PID/task/TID/children."""
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as handle:
                found.extend(int(child) for child in handle.read().split())
        except OSError:
            continue
    return found


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, parents before children."""
    found: list[int] = []
    frontier = children(pid)
    while frontier:
        found.extend(frontier)
        frontier = [grandchild for child in frontier for grandchild in children(child)]
    return found


def owned_pipe(owner: int | None) -> tuple[int, int]:
    """os.pipe() whose ends belong to uid `owner`: a sandbox user can then reopen its stdio through
    /dev/stdout or /proc/self/fd/N (pipes made by root are mode 0600 root)."""
    read_end, write_end = os.pipe()
    if owner is not None and owner != os.geteuid():
        os.fchown(read_end, owner, owner)
        os.fchown(write_end, owner, owner)
    return read_end, write_end


def close_fds(*fds: int | None) -> None:
    for fd in fds:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def send(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def exit_status(code: int) -> int:
    """Shell convention: a process killed by signal N reports 128 + N."""
    return 128 - code if code < 0 else code


def kill_by_environ(entry: str, wait: float = 2.0) -> None:
    """SIGKILL every other process whose environment holds `entry` ("NAME=value"), again until none is left
    (or `wait` seconds passed): children forked meanwhile inherit the entry and are caught on the next pass."""
    needle = entry.encode()
    deadline = time.monotonic() + wait
    while True:
        found = [pid for pid in _pids() if needle in _environ(pid)]
        if not found or time.monotonic() > deadline:
            return
        send(found, signal.SIGKILL)
        time.sleep(0.01)


def _pids() -> list[int]:
    own = os.getpid()
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != own]


def _environ(pid: int) -> list[bytes]:
    """The environment `pid` was started with (empty for zombies and processes we may not inspect)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return handle.read().split(b"\0")
    except OSError:
        return []


def kill_group(proc: subprocess.Popen[Any], timeout: float = 5.0) -> None:
    """SIGKILL the process group that `proc` leads (it was started with start_new_session) and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout)


class _Spawner:
    """Starts long-lived children from one thread that lives as long as the interpreter.

    bwrap --die-with-parent uses PR_SET_PDEATHSIG, which fires when the *thread* that forked the child exits,
    not the process. A shell started from a short-lived worker thread would die with that thread, so
    long-lived sandbox processes are forked here instead.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[list[str], dict[str, Any], Future[subprocess.Popen[bytes]]]] = (
            queue.SimpleQueue())
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        if threading.current_thread() is threading.main_thread():
            return subprocess.Popen(argv, **kwargs)
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="rl-llm-sandbox-spawner",
                                                daemon=True)
                self._thread.start()
        future: Future[subprocess.Popen[bytes]] = Future()
        self._jobs.put((argv, kwargs, future))
        return future.result()

    def _serve(self) -> None:
        while True:
            argv, kwargs, future = self._jobs.get()
            try:
                future.set_result(subprocess.Popen(argv, **kwargs))
            except BaseException as exc:  # hand every failure back to the caller's thread
                future.set_exception(exc)


spawn_long_lived = _Spawner().popen
