"""`SandboxPool`: warm sandboxes handed out to concurrent environments and reset between episodes."""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rl_llm.sandboxes.base import Sandbox, SandboxError, SandboxLimits
from rl_llm.sandboxes.factory import make, resolve_backend, split_kwargs
from rl_llm.sandboxes.workspace import log


class SandboxPool:
    """Up to `size` sandboxes of one backend, created on demand and reused.

    `with pool.acquire() as sb:` hands out an idle sandbox (waiting while all `size` are busy). Leaving the
    block returns at once: a background thread resets the sandbox (processes killed, workspace wiped; do not
    touch `sb` after the block) and, with `warm=True`, starts a fresh shell so the next `sb.session()` answers
    at once. Idle sandboxes are handed out oldest first; `prestart=True` creates all of them up front. A
    sandbox whose reset fails is closed and replaced. Thread-safe.
    `close()` (also at interpreter exit) waits for resets in flight and closes every sandbox; ones still in
    use are closed when they come back.
    """

    def __init__(self, size: int = 8, backend: str = "auto", *, warm: bool = True, prestart: bool = False,
                 limits: SandboxLimits | None = None, **kwargs: Any) -> None:
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"pool size must be a positive int, got {size!r}")
        self.size = size
        self.backend = resolve_backend(backend)
        overrides, _ = split_kwargs(self.backend, kwargs)  # bad arguments fail here, not at the first acquire
        SandboxLimits.from_kwargs(limits, **overrides)
        self._make_kwargs = dict(kwargs, limits=limits, keep_warm=warm)
        self._cond = threading.Condition()
        self._idle: deque[Sandbox] = deque()
        self._busy: set[Sandbox] = set()
        self._creating = 0
        self._resetting = 0
        self._closed = False
        weakref.finalize(self, _close_all, self._idle, self._busy)  # at exit, busy ones too
        if prestart:  # all `size` sandboxes now, so they take turns and each has time to warm up
            self._idle.extend(make(self.backend, **self._make_kwargs) for _ in range(size))

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {"size": self.size, "idle": len(self._idle), "busy": len(self._busy),
                    "resetting": self._resetting,
                    "created": len(self._idle) + len(self._busy) + self._creating}

    @contextlib.contextmanager
    def acquire(self, timeout: float | None = None) -> Iterator[Sandbox]:
        """An idle sandbox for the duration of the block; raises TimeoutError after `timeout` seconds."""
        sandbox = self._take(timeout)
        try:
            yield sandbox
        finally:
            self._give_back(sandbox)

    def close(self) -> None:
        """Close the idle sandboxes now (after resets in flight) and the busy ones as they come back."""
        with self._cond:
            self._closed = True
            while self._resetting:
                self._cond.wait()
            idle = list(self._idle)
            self._idle.clear()
            self._cond.notify_all()
        for sandbox in idle:
            sandbox.close()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _take(self, timeout: float | None) -> Sandbox:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    raise SandboxError("the sandbox pool is closed")
                if self._idle:
                    sandbox = self._idle.popleft()
                    self._busy.add(sandbox)
                    return sandbox
                if len(self._busy) + self._creating < self.size:
                    self._creating += 1
                    break
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"no sandbox free in the pool of {self.size} within {timeout} s")
                self._cond.wait(remaining)
        try:
            sandbox = make(self.backend, **self._make_kwargs)
        except BaseException:
            with self._cond:
                self._creating -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._creating -= 1
            self._busy.add(sandbox)
        return sandbox

    def _give_back(self, sandbox: Sandbox) -> None:
        with self._cond:
            recycle = not self._closed and not sandbox.closed
            if recycle:
                self._resetting += 1
        if recycle:
            _RESETTER.submit(self._reset, sandbox)
        else:
            self._settle(sandbox, healthy=False)

    def _reset(self, sandbox: Sandbox) -> None:
        try:
            sandbox.reset()
            healthy = True
        except Exception:
            log.exception("sandbox reset failed; replacing it")
            healthy = False
        self._settle(sandbox, healthy, was_resetting=True)

    def _settle(self, sandbox: Sandbox, healthy: bool, was_resetting: bool = False) -> None:
        """Back to the idle queue, or closed (unhealthy, or the pool closed meanwhile)."""
        with self._cond:
            keep = healthy and not self._closed
            if keep:
                self._idle.append(sandbox)
                self._settled(sandbox, was_resetting)
        if not keep:
            try:
                sandbox.close()
            finally:  # only now: `close()` waits for resets to settle, and then every sandbox must be closed
                with self._cond:
                    self._settled(sandbox, was_resetting)

    def _settled(self, sandbox: Sandbox, was_resetting: bool) -> None:
        """Bookkeeping once a returned sandbox is idle or closed (called with the lock held)."""
        self._busy.discard(sandbox)
        if was_resetting:
            self._resetting -= 1
        self._cond.notify_all()


# Resets run here so that releasing a sandbox never waits for its namespaces to be torn down.
_RESETTER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="rl-llm-sandbox-reset")


def _close_all(idle: deque[Sandbox], busy: set[Sandbox]) -> None:
    while idle:
        idle.popleft().close()
    for sandbox in list(busy):
        sandbox.close()
