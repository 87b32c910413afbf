"""SandboxPool: 1,000 sequential and 200 concurrent runs with nothing leaked, and cleanup after a crash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rl_llm.sandboxes import SandboxError, SandboxPool, cleanup_stale

from .conftest import TEST_LIMITS, host_snapshot, needs_root, processes_of_uid, require_backend


@pytest.fixture(params=["bwrap", "docker"])
def pool_backend(request: pytest.FixtureRequest) -> str:
    require_backend(request.param)
    return request.param


class Tracker:
    """Remembers every sandbox a pool handed out, to check afterwards that none of them left anything."""

    def __init__(self) -> None:
        self.uids: set[int] = set()
        self.roots: set[Path] = set()
        self._lock = threading.Lock()

    def saw(self, sb) -> None:
        with self._lock:
            self.uids.add(sb._workspace.uid)
            self.roots.add(sb._workspace.root)

    def assert_clean(self, before: dict[str, object]) -> None:
        deadline = time.monotonic() + 5
        while any(processes_of_uid(uid) for uid in self.uids) and time.monotonic() < deadline:
            time.sleep(0.05)
        for uid in self.uids:
            assert processes_of_uid(uid) == [], f"processes of sandbox uid {uid} leaked"
        assert not [root for root in self.roots if root.exists()], "sandbox directories leaked"
        after = host_snapshot()
        assert after["mounts"] == before["mounts"], "mounts leaked into the host namespace"
        assert after["fds"] <= before["fds"], "file descriptors leaked"  # earlier tests' garbage may go
        assert after["children"] <= before["children"], "child processes leaked"


def test_thousand_sequential_runs_leak_nothing(pool_backend):
    needs_root()
    before, tracker = host_snapshot(), Tracker()
    with SandboxPool(size=4, backend=pool_backend, prestart=True, **TEST_LIMITS) as pool:
        for i in range(1000):
            with pool.acquire() as sb:
                tracker.saw(sb)
                sh = sb.session()
                if i % 50 == 0:  # now and then files and a cold run; otherwise the cheapest warm command
                    assert sb.run("ls -A").stdout == ""  # reset wiped what the last user left
                    sb.write_file("f.txt", str(i))
                    assert sh.run("cat f.txt; echo x > left-behind.txt; sleep 60 &").stdout == str(i)
                assert sh.run(f"echo {i}").stdout == f"{i}\n"
        assert pool.stats()["created"] == 4 and len(tracker.uids) == 4
    tracker.assert_clean(before)


def test_two_hundred_concurrent_runs_leak_nothing(pool_backend):
    needs_root()
    before, tracker = host_snapshot(), Tracker()

    def episode(i: int) -> str:
        with pool.acquire(timeout=60) as sb:
            tracker.saw(sb)
            assert sb.run("ls -A").stdout == ""  # every episode starts from an empty workspace
            sh = sb.session()
            sh.run(f"echo {i} > mine.txt; sleep 0.0{i % 10} &")  # leaves a background job behind
            return sh.run("cat mine.txt").stdout

    with SandboxPool(size=8, backend=pool_backend, **TEST_LIMITS) as pool, ThreadPoolExecutor(16) as workers:
        results = list(workers.map(episode, range(200)))
        assert pool.stats()["created"] <= 8
    assert results == [f"{i}\n" for i in range(200)]
    tracker.assert_clean(before)


def test_acquire_waits_times_out_and_refuses_after_close():
    require_backend("bwrap")
    pool = SandboxPool(size=1, backend="bwrap", warm=False, **TEST_LIMITS)
    with pool.acquire() as sb:
        with pytest.raises(TimeoutError), pool.acquire(timeout=0.2):
            pass
        sb.run("touch leftover")
    with pool.acquire() as again:
        assert again is sb and again.run("ls -A").stdout == ""
    pool.close()
    assert sb.closed
    with pytest.raises(SandboxError, match="closed"), pool.acquire():
        pass


def test_close_returns_only_once_a_sandbox_still_resetting_is_closed():
    require_backend("bwrap")
    pool = SandboxPool(size=1, backend="bwrap", warm=False, **TEST_LIMITS)
    with pool.acquire() as sb:
        sb._res.extra_cleanup.append(lambda: time.sleep(0.5))  # a slow close, like removing a container
        sb.reset = lambda: (time.sleep(0.2), type(sb).reset(sb))  # still resetting when the pool closes
        workdir = sb.workdir
    pool.close()
    assert sb.closed and not workdir.exists()


def test_a_sandbox_broken_by_its_user_is_replaced():
    require_backend("bwrap")
    with SandboxPool(size=1, backend="bwrap", **TEST_LIMITS) as pool:
        with pool.acquire() as first:
            first.close()  # e.g. an environment closed it by mistake
        with pool.acquire() as second:
            assert second is not first and second.run("echo ok").stdout == "ok\n"


def test_bad_pool_arguments():
    with pytest.raises(ValueError):
        SandboxPool(size=0)
    with pytest.raises(TypeError, match="unknown argument"):
        SandboxPool(size=1, backend="local", memory=5)
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxPool(size=1, backend="local", memory_mb=-1)


CRASHER = textwrap.dedent("""
    import os, sys, time
    from rl_llm.sandboxes import SandboxPool
    pool = SandboxPool(size=2, backend=sys.argv[1], wall_timeout=30)
    held = []
    for _ in range(2):
        ctx = pool.acquire(); sb = ctx.__enter__(); held.append(ctx)
        sh = sb.session(); sh.run("sleep 600 & echo started")
        sb.run("true")
        print(sb._workspace.uid, sb._workspace.root, flush=True)
    print("READY", flush=True)
    sys.stdin.readline()  # the test has seen the sandboxes running
    if sys.argv[2] == "interrupt":
        os.kill(os.getpid(), 2)  # KeyboardInterrupt inside the `with` blocks
    time.sleep(600)
""")


@pytest.mark.parametrize("how", ["sigkill", "interrupt"])
def test_nothing_survives_a_crashed_or_interrupted_owner(how):
    needs_root()
    require_backend("bwrap")
    proc = subprocess.Popen([sys.executable, "-c", CRASHER, "bwrap", how], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    owned = []
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("READY"):
            break
        uid, root = line.split()
        owned.append((int(uid), Path(root)))
    assert len(owned) == 2, proc.stderr.read() if proc.stderr else ""
    assert all(processes_of_uid(uid) for uid, _ in owned)  # the sandboxes are really running
    if how == "sigkill":
        os.kill(proc.pid, signal.SIGKILL)
    else:
        proc.communicate("go\n", timeout=30)
    proc.wait(30)
    deadline = time.monotonic() + 5
    while any(processes_of_uid(uid) for uid, _ in owned) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [uid for uid, _ in owned if processes_of_uid(uid)] == []  # --die-with-parent took them down
    if how == "sigkill":  # no finalizer could run; the next sandbox user sweeps the dead owner's slots
        cleanup_stale()
    assert [root for _, root in owned if root.exists()] == []
