"""Fixtures for the sandbox tests: one parameter per backend, skipped with the backend's own reason when it
cannot run here, and host-side probes for leaks (processes, mounts, directories, file descriptors)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_llm.sandboxes import Sandbox, backend_problem, make
from rl_llm.sandboxes.workspace import running_as_root

ALL_BACKENDS = ["bwrap", "docker", "local"]
ISOLATING_BACKENDS = ["bwrap", "docker"]
# Limits small enough that the attacks finish fast, large enough for python3 to start.
TEST_LIMITS = dict(wall_timeout=10.0, cpu_time=10, memory_mb=512, max_processes=48, max_output_bytes=200_000,
                   max_file_size_mb=8, max_open_files=128, tmp_size_mb=16)


def require_backend(name: str) -> None:
    problem = backend_problem(name)
    if problem is not None:
        pytest.skip(f"{name} backend unavailable here: {problem}")


@pytest.fixture(params=ALL_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    require_backend(request.param)
    return request.param


@pytest.fixture(params=ISOLATING_BACKENDS)
def isolating_backend(request: pytest.FixtureRequest) -> str:
    require_backend(request.param)
    return request.param


@pytest.fixture
def sandbox(backend: str) -> Iterator[Sandbox]:
    with make(backend, **TEST_LIMITS) as sb:
        yield sb


@pytest.fixture
def isolated(isolating_backend: str) -> Iterator[Sandbox]:
    with make(isolating_backend, **TEST_LIMITS) as sb:
        yield sb


def processes_of_uid(uid: int) -> list[int]:
    """Host pids whose real uid is `uid` (each sandbox slot has its own uid when the tests run as root).
    Zombies are left out unless they are ours to reap: a dead orphan waits for the host's init, not for us."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
        except OSError:
            continue
        zombie_of_another = fields["State"].strip().startswith("Z") and int(fields["PPid"]) != os.getpid()
        if int(fields["Uid"].split()[0]) == uid and not zombie_of_another:
            found.append(int(entry))
    return found


def host_snapshot() -> dict[str, object]:
    """What must be the same before and after sandboxes come and go."""
    with open("/proc/self/mountinfo") as handle:
        mounts = handle.read().count("\n")
    return {"mounts": mounts, "fds": len(os.listdir("/proc/self/fd")),
            "children": len(_children(os.getpid()))}


def _children(pid: int) -> list[str]:
    found: list[str] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as handle:
            found.extend(handle.read().split())
    return found


def needs_root() -> None:
    if not running_as_root():
        pytest.skip("per-sandbox uids (and leak checks by uid) need the tests to run as root")


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A host file no sandbox may read or change."""
    path = tmp_path / "canary.txt"
    path.write_text("host secret 7f3a")
    return path
