"""The `terminal` part of benchmarks/serving.py: where step latency doubles, and whole Terminal-v0 episodes
played by the oracle on real bwrap sandboxes (one episode, and a burst of resets against a low start cap)."""

from __future__ import annotations

from types import ModuleType

import pytest

from rl_llm.sandboxes import backend_problem
from rl_llm.sandboxes.factory import starts
from tests.scripts import load_benchmark

pytest.importorskip("fastapi", reason="benchmarks/serving.py needs fastapi (the serve extra)")

BWRAP_PROBLEM = backend_problem("bwrap")
NEEDS_BWRAP = pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=f"needs bubblewrap: {BWRAP_PROBLEM}")


@pytest.fixture(scope="module")
def serving() -> ModuleType:
    return load_benchmark("serving")


def test_doubles_at_names_the_first_point_at_twice_the_baseline(serving: ModuleType) -> None:
    assert serving.doubles_at([(1, 4.0), (4, 7.9), (16, 8.0), (64, 30.0)]) == "step p50 doubles at N=16 (2.00x N=1)"
    assert serving.doubles_at([(2, 5.0), (8, 12.5)]) == "step p50 doubles at N=8 (2.50x N=2)"
    assert serving.doubles_at([(1, 4.0), (4, 7.9), (16, 7.99)]).endswith("not reached up to N=16")
    assert serving.doubles_at([(1, 4.0)]).endswith("not reached up to N=1")
    # No steps at the baseline (every episode failed): no ratio to speak of, rather than a division by nan.
    assert serving.doubles_at([(1, float("nan")), (4, 9.0)]) == "no step p50 at N=1 to compare with"


@NEEDS_BWRAP
def test_a_worker_plays_whole_oracle_episodes_that_solve_their_tasks(serving: ModuleType) -> None:
    times = serving.terminal_worker("bwrap", 0.0, first_seed=3)  # no time after the first: exactly one episode
    assert times.errors == []
    assert (times.episodes, times.solved) == (1, 1)
    assert len(times.first_resets) == 1 and times.resets == []
    assert len(times.checks) == 1 and len(times.steps) >= 1  # the task's commands, then the checked `done`


@NEEDS_BWRAP
def test_a_burst_of_resets_queues_behind_the_start_cap_and_none_fails(serving: ModuleType) -> None:
    limit = starts.limit
    line = serving.terminal_burst("bwrap", 3, 1)
    assert "3 resets released at once, start cap 1: 0 failed" in line
    assert "of 3 sandbox starts waited" in line  # every reset started its own sandbox through the gate
    assert "error:" not in line
    assert starts.limit == limit  # the cap is given back


def test_the_bare_apps_openenv_routes_answer_openenv_clients_with_the_servers_own_replies(serving: ModuleType) -> None:
    """The OpenEnv rows' baseline must speak OpenEnv: openenv-core's own client plays whole episodes against
    the bare app's ``/ws`` and gets the OpenEnv server's recorded replies, and plain HTTP gets its bodies."""
    pytest.importorskip("openenv.core", reason="the OpenEnv rows need openenv-core (the openenv extra)")
    import httpx
    from openenv.core import GenericEnvClient

    from rl_llm.integrations.http_server import BackgroundServer

    recorded_http, recorded_ws = serving.recorded_openenv_episode()
    assert recorded_http[0]["done"] is False and recorded_http[-1]["done"] is True
    assert [m["data"] for m in recorded_ws] == recorded_http  # the same replies over both transports
    with BackgroundServer(serving.bare_app()) as server:
        with GenericEnvClient(base_url=server.url).sync() as env:
            for _ in range(2):  # a second episode starts over
                results = [env.reset(seed=0)]
                while not results[-1].done:
                    results.append(env.step({"message": serving.ACTION}))
                assert [r.observation for r in results] == [m["observation"] for m in recorded_http]
                assert [r.reward for r in results] == [m["reward"] for m in recorded_http]
        body = {"action": {"message": serving.ACTION}, "episode_id": "e"}
        assert httpx.post(server.url + "/reset", json={"seed": 0, "episode_id": "e"}).json() == recorded_http[0]
        assert httpx.post(server.url + "/step", json=body).json() == recorded_http[1]


def test_a_point_says_which_side_bounds_it(serving: ModuleType) -> None:
    point = serving.Point(calls=1000, seconds=1.0, latencies=[], errors=0, server_cpu_s=0.05, client_cpu_s=0.03)
    assert (round(point.cpu_us), round(point.client_cpu_us), point.bound) == (50, 30, "server")
    point.add(serving.Point(calls=1000, seconds=1.0, latencies=[], errors=0, server_cpu_s=0.01, client_cpu_s=0.09))
    assert (round(point.cpu_us), round(point.client_cpu_us), point.bound) == (30, 60, "client")


def test_the_in_process_calls_play_real_episodes_and_fail_loudly_on_an_error(serving: ModuleType) -> None:
    import asyncio

    from rl_llm.integrations.http_server import EnvServer, ServerConfig

    server = EnvServer(ServerConfig(allowed_env_ids=frozenset({serving.ENV_ID})))
    assert asyncio.run(serving.asgi_episodes(server.app, False, 0.0)) > 0  # one whole episode, every call a 200
    assert server.snapshot()["live_sessions"] == 64 and server.stats.inline_calls + server.stats.pool_calls == 11
    with pytest.raises(RuntimeError, match="404"):  # a failed call is not timed as a fast one
        asyncio.run(serving.asgi_post(server.app, "/sessions/nope/step", b'{"action": "x"}'))
    server.shutdown()
