"""An env server process killed (SIGKILL) mid-run and restarted: clients get clear errors naming the lost
sessions, never a hang or a raw traceback, and the rollout engine records the lost episodes as errors."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from rl_llm.agents.baselines import make_baseline
from rl_llm.agents.evaluate import evaluate
from rl_llm.integrations.http_client import EnvClient, EnvServerError, EnvServerUnavailable

BANDIT = "rl-llm/MultiArmedBandit-v0"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def server_process(port: int, *argv: str, module: str = "rl_llm.integrations.http_server"
                   ) -> Iterator[subprocess.Popen[bytes]]:  # fmt: skip
    command = [sys.executable, "-m", module, "--port", str(port), "--env", BANDIT, *argv]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.HTTPError:
                assert process.poll() is None and time.monotonic() < deadline, "the env server did not start"
                time.sleep(0.1)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def kill(process: subprocess.Popen[bytes]) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.wait(10)


def test_a_killed_server_names_the_lost_sessions_and_after_a_restart_says_it_restarted() -> None:
    port = free_port()
    with EnvClient(f"http://127.0.0.1:{port}", timeout=30) as client:
        with server_process(port) as first:
            ids = client.create(BANDIT, count=2, horizon=10)
            client.reset_batch(ids, [0, 1])
            client.step(ids[0], "<action>A</action>")
            kill(first)
            with pytest.raises(EnvServerUnavailable) as down:
                client.step(ids[0], "<action>A</action>")
            assert ids[0] in str(down.value) and "unreachable" in str(down.value) and down.value.status == 503
            with pytest.raises(EnvServerUnavailable) as down:
                client.step_batch(ids, ["<action>B</action>"] * 2)
            assert down.value.session_ids == ids
        with server_process(port):
            with pytest.raises(EnvServerError) as lost:
                client.step(ids[1], "<action>A</action>")
            assert lost.value.status == 404
            assert ids[1] in lost.value.detail and "restarted" in lost.value.detail
            batch = client.step_batch(ids, ["<action>A</action>"] * 2)
            assert all(isinstance(r, EnvServerError) and "restarted" in r.detail for r in batch)
            # the restarted server serves new sessions as usual
            fresh = client.make(BANDIT, horizon=2)
            fresh.reset(seed=0)
            assert fresh.step("<action>A</action>")[2] is False


def test_episodes_in_flight_when_the_server_dies_end_as_errors_naming_their_session() -> None:
    port = free_port()
    with EnvClient(f"http://127.0.0.1:{port}", timeout=30) as client, server_process(port) as process:
        made: list[str] = []

        def make_env() -> object:
            env = client.make(BANDIT, horizon=100_000)  # far longer than the test: the kill ends it
            made.append(env.session_id)
            return env

        result: list[object] = []
        runner = threading.Thread(
            target=lambda: result.extend(evaluate(make_env, make_baseline("random", BANDIT, seed=0), 2, batch_size=2))
        )
        runner.start()
        deadline = time.monotonic() + 60
        while client.stats().get("inline_calls", 0) + client.stats().get("pool_calls", 0) < 40:
            assert time.monotonic() < deadline and runner.is_alive(), "the episodes never got going"
            time.sleep(0.02)
        kill(process)
        runner.join(120)
        assert not runner.is_alive(), "the rollout hung after the server died"
    assert len(result) == 2 and len(made) == 2
    for trajectory in result:
        assert trajectory.end_reason == "error"
        assert "unreachable" in trajectory.error and any(sid in trajectory.error for sid in made)
