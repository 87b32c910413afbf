"""The process-wide cap on sandboxes starting at once: a burst of starts queues instead of failing."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from rl_llm.sandboxes import backend_problem, make
from rl_llm.sandboxes.factory import starts

LIMITS = dict(wall_timeout=10.0, cpu_time=10, memory_mb=512, max_processes=48)


@pytest.fixture
def backend() -> str:
    # bwrap is the isolating backend a CI machine has; local (rlimits only) exercises the same gate without it
    return "bwrap" if backend_problem("bwrap") is None else "local"


@pytest.fixture
def limit_two() -> object:
    before = starts.limit
    starts.set_limit(2)
    yield
    starts.set_limit(before)


def test_a_burst_of_starts_never_exceeds_the_limit_and_every_start_succeeds(backend: str, limit_two: object) -> None:
    first = starts.stats()
    barrier = threading.Barrier(6)

    def start() -> str:
        barrier.wait()
        sandbox = make(backend, **LIMITS)
        try:
            return sandbox.run("echo ok", timeout=10).stdout.strip()
        finally:
            sandbox.close()

    with ThreadPoolExecutor(6) as pool:
        assert list(pool.map(lambda _: start(), range(6))) == ["ok"] * 6
    stats = starts.stats()
    assert stats["started"] - first["started"] == 6
    assert stats["peak"] <= max(2, first["peak"]) and stats["in_flight"] == 0


def test_a_start_waits_for_a_free_slot_and_then_goes_ahead(backend: str, limit_two: object) -> None:
    waited = starts.stats()["waited"]
    made: list[object] = []
    with starts.slot(), starts.slot():  # both slots taken
        worker = threading.Thread(target=lambda: made.append(make(backend, **LIMITS)))
        worker.start()
        worker.join(0.5)
        assert worker.is_alive() and not made  # queued, not failed
        assert starts.stats()["waited"] == waited + 1
    worker.join(30)
    assert len(made) == 1
    made[0].close()  # type: ignore[attr-defined]


def test_the_limit_must_be_a_positive_int() -> None:
    with pytest.raises(ValueError, match="positive int"):
        starts.set_limit(0)
