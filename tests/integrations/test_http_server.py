"""The HTTP env server on 127.0.0.1 with real uvicorn, driven by the httpx client and by raw requests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from rl_llm.agents.baselines import make_baseline
from rl_llm.agents.evaluate import evaluate
from rl_llm.envs.base import Outcome, Task, TextEnv
from rl_llm.integrations.generic import EnvFactory
from rl_llm.integrations.http_client import EnvClient, EnvServerError
from rl_llm.integrations.http_server import BackgroundServer, EnvServer, ServerConfig

TTT = "rl-llm/TicTacToe-v0"
BANDIT = "rl-llm/MultiArmedBandit-v0"
HANG = "test/Hang-v0"


class HangEnv(TextEnv):
    """Echo env whose step blocks on ``release`` for the action ``hang`` and raises for ``boom``."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__(max_turns=3)
        self.release = release

    def _reset(self, options: dict[str, Any]) -> Task:
        return Task("say something", "hang-0", "test env")

    def _step(self, action: str) -> Outcome:
        if action == "hang":
            self.release.wait(60)
        if action == "boom":
            raise KeyError("env bug")
        if action == "no-sandbox":  # an env's own timeout (e.g. SandboxPool.acquire) is an env error
            raise TimeoutError("no sandbox free within 0.1 s")
        if action == "gym-says-no":  # Gymnasium's own argument checks raise gymnasium.error.Error subclasses
            raise gym.error.InvalidAction("not an action this env takes")
        return Outcome(f"echo {action}", {"echo": 1.0})


class CloseRecorder(gym.Wrapper):
    """Counts real ``close()`` calls on the wrapped env."""

    def __init__(self, env: gym.Env, closed: list[gym.Env]) -> None:
        super().__init__(env)
        self._closed_log = closed

    def close(self) -> None:
        self._closed_log.append(self)
        super().close()


@dataclass
class EnvLedger:
    """Every env the server built and every one it closed."""

    release: threading.Event = field(default_factory=threading.Event)
    built: list[gym.Env] = field(default_factory=list)
    closed: list[gym.Env] = field(default_factory=list)

    def make(self, env_id: str, kwargs: dict[str, Any]) -> gym.Env:
        if kwargs.get("broken"):
            raise RuntimeError("cannot reach the sandbox daemon")
        env = HangEnv(self.release) if env_id == HANG else EnvFactory(env_id, **kwargs)()
        wrapped = CloseRecorder(env, self.closed)
        self.built.append(wrapped)
        return wrapped

    def all_closed_once(self) -> bool:
        return len(self.closed) == len(self.built) and {id(e) for e in self.closed} == {id(e) for e in self.built}


@dataclass
class Served:
    server: EnvServer
    client: EnvClient
    ledger: EnvLedger
    url: str


@contextmanager
def serve(**config: Any) -> Iterator[Served]:
    ledger = EnvLedger()
    server = EnvServer(ServerConfig(allowed_env_ids=frozenset({TTT, BANDIT, HANG}), **config), make_env=ledger.make)
    with BackgroundServer(server.app) as background, EnvClient(background.url, timeout=30) as client:
        try:
            yield Served(server, client, ledger, background.url)
        finally:
            ledger.release.set()


def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def records_key(trajectories: list[Any]) -> list[tuple[Any, ...]]:
    return [(t.seed, t.task_id, t.total_reward, t.messages, t.error) for t in trajectories]


def play_local(seed: int, episodes: int) -> list[Any]:
    policy = make_baseline("random", TTT, seed=seed)
    return evaluate(EnvFactory(TTT), policy, episodes, seed=seed, batch_size=3)


def test_remote_env_plays_exactly_like_a_local_env() -> None:
    with serve() as served:
        server, client, ledger = served.server, served.client, served.ledger
        remote, local = client.make(TTT, opponent="minimax"), EnvFactory(TTT, opponent="minimax")()
        assert remote.reset(seed=5)[0] == local.reset(seed=5)[0]
        for move in ("<move>B2</move>", "<move>A1</move>", "nonsense", "<move>C3</move>", "<move>A3</move>"):
            remote_step, local_step = remote.step(move), local.step(move)
            assert remote_step[:4] == local_step[:4]
            assert remote_step[4]["reward_components"] == local_step[4]["reward_components"]
            if remote_step[2] or remote_step[3]:
                break
        remote.close()
        assert wait_until(ledger.all_closed_once)
    assert server.snapshot()["live_sessions"] == 0


def test_concurrent_clients_get_the_same_episodes_as_local_play() -> None:
    seeds = [0, 100, 200, 300, 400, 500]
    with serve() as served:
        server, ledger = served.server, served.ledger

        def remote_run(seed: int) -> list[Any]:
            with EnvClient(served.url) as client:
                policy = make_baseline("random", TTT, seed=seed)
                return evaluate(lambda: client.make(TTT), policy, 4, seed=seed, batch_size=3)

        with ThreadPoolExecutor(len(seeds)) as pool:
            remote = list(pool.map(remote_run, seeds))
        assert [records_key(r) for r in remote] == [records_key(play_local(seed, 4)) for seed in seeds]
        assert wait_until(ledger.all_closed_once)  # the rollout engine closes its envs -> DELETE
        assert len(ledger.built) == len(seeds) * 3
    assert server.snapshot()["live_sessions"] == 0


def test_batched_reset_and_step_report_errors_per_item() -> None:
    with serve() as served:
        client = served.client
        ids = client.create(BANDIT, count=3, horizon=4)
        resets = client.reset_batch([*ids, "missing"], [1, 2, 3, 4])
        assert [isinstance(r, EnvServerError) for r in resets] == [False, False, False, True]
        assert resets[3].status == 404
        local = EnvFactory(BANDIT, horizon=4)()
        assert resets[1][0] == local.reset(seed=2)[0]
        steps = client.step_batch([ids[0], "missing", ids[1], ids[1]], ["<action>A</action>"] * 4)
        assert isinstance(steps[1], EnvServerError) and steps[1].status == 404
        # the same session twice in one batch: one step runs, the other is refused as busy
        assert sorted(isinstance(s, EnvServerError) and s.status == 409 for s in steps[2:]) == [False, True]
        assert steps[2 if not isinstance(steps[2], EnvServerError) else 3][:4] == local.step("<action>A</action>")[:4]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "needle"),
    [
        ("POST", "/sessions", b"{not json", 422, "json"),
        ("POST", "/sessions", {"kwargs": {}}, 422, "env_id"),
        ("POST", "/sessions", {"env_id": TTT, "surprise": 1}, 422, "surprise"),
        ("POST", "/sessions", {"env_id": TTT, "count": 0}, 422, "count"),
        ("POST", "/sessions", {"env_id": TTT, "count": True}, 422, "count"),  # true and "2" were counts
        ("POST", "/sessions", {"env_id": TTT, "count": "2"}, 422, "count"),
        ("POST", "/sessions", {"env_id": "rl-llm/Nope-v0"}, 400, "not served"),
        ("POST", "/sessions", {"env_id": TTT, "kwargs": {"opponent": "god"}}, 400, "opponent"),
        ("POST", "/sessions", {"env_id": TTT, "kwargs": {"no_such_arg": 1}}, 400, "takes no option 'no_such_arg'; its options are"),
        ("POST", "/sessions/{sid}/reset", {"seed": "three"}, 422, "seed"),
        ("POST", "/sessions/{sid}/reset", {"seed": -1}, 422, "greater than or equal to 0"),  # was a 500, closed
        ("POST", "/sessions/{sid}/reset", {"options": {"agent_mark": "Z"}}, 400, "agent_mark"),
        ("POST", "/sessions/{sid}/step", {"action": "<move>B2</move>"}, 409, "reset"),
        ("POST", "/sessions/{sid}/step", {}, 422, "exactly one"),
        ("POST", "/sessions/{sid}/step", {"action": 7}, 422, "action"),
        ("POST", "/sessions/{sid}/step", {"messages": [{"role": "user", "content": "hi"}]}, 422, "assistant"),
        # Hostile JSON that FastAPI's own 422 reply could not encode (a bare 500 before), or could not parse.
        ("POST", "/sessions/{sid}/reset", b'{"seed": NaN}', 422, "seed"),
        ("POST", "/sessions/{sid}/reset", b'{"seed": 1e400}', 422, "seed"),
        ("POST", "/sessions/{sid}/step", b'{"action": "\\ud800"}', 422, "unicode"),
        ("POST", "/sessions/{sid}/reset", b"[" * 100_000 + b"]" * 100_000, 400, "error parsing the body"),
        ("POST", "/sessions/unknown-id/reset", {}, 404, "unknown session"),
        ("POST", "/sessions/unknown-id/step", {"action": "x"}, 404, "unknown session"),
        ("DELETE", "/sessions/unknown-id", None, 404, "unknown session"),
        ("POST", "/batch/step", {"items": [{"action": "x"}]}, 422, "session_id"),
    ],
)
def test_malformed_requests_get_clear_4xx_errors(method: str, path: str, body: Any, status: int, needle: str) -> None:
    with serve() as served:
        client = served.client
        session_id = client.create(TTT)[0]
        content = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
        headers = {"content-type": "application/json"}
        response = httpx.request(method, served.url + path.format(sid=session_id), content=content, headers=headers)
        assert response.status_code == status, response.text
        assert needle.lower() in response.text.lower()
        # the session survives every rejected request
        assert client.reset(session_id, seed=1)[0]


def test_stepping_an_ended_episode_is_a_conflict_until_reset() -> None:
    with serve() as served:
        client = served.client
        env = client.make(BANDIT, horizon=1)
        env.reset(seed=0)
        assert env.step("<action>A</action>")[2]
        with pytest.raises(EnvServerError) as error:
            env.step("<action>A</action>")
        assert error.value.status == 409
        env.reset(seed=0)
        assert env.step("<action>B</action>")[2]


def test_max_sessions_is_enforced_and_freed_by_close() -> None:
    with serve(max_sessions=3) as served:
        client, ledger = served.client, served.ledger
        ids = client.create(TTT, count=2)
        with pytest.raises(EnvServerError) as error:
            client.create(TTT, count=2)
        assert error.value.status == 429
        assert len(ledger.built) == 2  # the refused request built nothing
        client.close_session(ids[0])
        assert len(client.create(TTT, count=2)) == 2


def test_hung_step_times_out_closes_the_session_and_later_closes_the_env() -> None:
    with serve(step_timeout_s=2.0) as served:
        server, client, ledger = served.server, served.client, served.ledger
        hung, healthy = client.make(HANG), client.make(HANG)
        hung.reset()
        healthy.reset()
        with pytest.raises(EnvServerError) as error:
            hung.step("hang")
        assert error.value.status == 504 and "closed" in error.value.detail
        assert healthy.step("fine")[0] == "echo fine"  # other sessions keep working meanwhile
        with pytest.raises(EnvServerError) as error:
            hung.step("again")
        assert error.value.status == 404
        assert ledger.closed == []  # its step is still running: closing now would race it
        ledger.release.set()
        assert wait_until(lambda: len(ledger.closed) == 1)
        assert ledger.closed[0] is ledger.built[0]
        assert server.snapshot()["timeouts"] == 1


def test_env_exception_returns_500_and_closes_the_session() -> None:
    with serve() as served:
        server, client, ledger = served.server, served.client, served.ledger
        env = client.make(HANG)
        env.reset()
        with pytest.raises(EnvServerError) as error:
            env.step("boom")
        assert error.value.status == 500 and "KeyError" in error.value.detail
        assert wait_until(ledger.all_closed_once)
        assert server.snapshot()["live_sessions"] == 0


def test_an_env_refusing_input_through_gymnasiums_errors_is_a_400_that_keeps_the_session() -> None:
    with serve() as served:
        env = served.client.make(HANG)
        env.reset()
        with pytest.raises(EnvServerError) as error:
            env.step("gym-says-no")
        assert error.value.status == 400 and "not an action this env takes" in error.value.detail
        assert env.step("hello")[0] == "echo hello"  # the session and its episode go on
        assert served.server.snapshot()["live_sessions"] == 1


def test_an_env_raising_timeout_error_is_an_env_failure_not_a_server_timeout() -> None:
    with serve(step_timeout_s=30.0) as served:
        server, client, ledger = served.server, served.client, served.ledger
        env = client.make(HANG)
        env.reset()
        with pytest.raises(EnvServerError) as error:
            env.step("no-sandbox")
        assert error.value.status == 500 and "TimeoutError: no sandbox free" in error.value.detail
        assert server.snapshot()["timeouts"] == 0
        assert wait_until(ledger.all_closed_once)


def test_an_env_that_fails_to_build_gets_a_json_500() -> None:
    with serve() as served:
        response = httpx.post(served.url + "/sessions", json={"env_id": HANG, "kwargs": {"broken": True}, "count": 2})
        assert response.status_code == 500
        assert "RuntimeError: cannot reach the sandbox daemon" in response.json()["detail"]
        assert served.server.snapshot()["live_sessions"] == 0


def test_a_client_that_disappears_has_its_sessions_reaped() -> None:
    with serve(session_ttl_s=0.3, reap_interval_s=0.05) as served:
        server, ledger, url = served.server, served.ledger, served.url
        vanishing = EnvClient(url)
        ids = vanishing.create(TTT, count=4)
        vanishing.reset_batch(ids, [0, 1, 2, 3])
        vanishing.step_batch(ids[:2], ["<move>B2</move>"] * 2)  # two mid-episode, two just reset
        vanishing.close()  # gone without closing its sessions
        assert wait_until(lambda: server.snapshot()["live_sessions"] == 0)
        assert wait_until(ledger.all_closed_once)
        # envs_closed is counted after close() returns, on a pool thread: wait for it, not just the ledger
        assert wait_until(lambda: server.snapshot()["envs_closed"] == 4)
        stats = server.snapshot()
        assert stats["reaped"] == 4 and stats["envs_created"] == stats["envs_closed"] == 4
        with EnvClient(url) as client, pytest.raises(EnvServerError) as error:
            client.step(ids[0], "<move>A1</move>")
        assert error.value.status == 404


def test_shutdown_closes_every_live_session() -> None:
    with serve() as served:
        client, ledger = served.client, served.ledger
        client.create(TTT, count=3)
        env = client.make(BANDIT)
        env.reset(seed=1)
    assert ledger.all_closed_once() and len(ledger.built) == 4


def test_fast_routes_answer_exactly_as_the_fastapi_routes() -> None:
    """Every request below gets the same status, headers that matter and JSON body from the server with its
    reset/step fast routes as from FastAPI's routes alone: whole seeded episodes, the env's own errors, and
    the requests the fast routes leave to FastAPI (its 422s)."""
    from fastapi.testclient import TestClient

    requests: list[tuple[str, Any]] = [
        ("bandit/reset", {"seed": 3}),
        *[("bandit/step", {"action": f"<action>{arm}</action>"}) for arm in "ABBA"],
        ("bandit/step", {"action": "no arm here é中"}),  # an invalid action: a penalty, not an error
        ("bandit/step", {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<action>B</action>"}]}),
        ("bandit/reset", {"seed": 4, "options": {"means": [0.1, 0.9]}}),  # the env refuses the option: 400
        ("bandit/reset", {"seed": 4}),
        ("hang/reset", {}),
        ("hang/step", {"action": "gym-says-no"}),  # 400, the episode goes on
        ("hang/step", {"action": "hello"}),
        ("hang/step", {"action": "boom"}),  # 500, the session is closed
        ("hang/step", {"action": "hello"}),  # 404 naming the closed session
        ("fresh/step", {"action": "x"}),  # no episode yet: 409
        ("unknown-id/reset", {}),
        # Left to FastAPI: its validation errors.
        ("fresh/reset", {"seed": -1}),
        ("fresh/reset", {"seed": "three", "surprise": 1}),
        ("fresh/step", {}),
        ("fresh/step", {"action": 7}),
        ("fresh/step", {"messages": [{"role": "user", "content": "hi"}]}),  # 422 from the handler
        ("fresh/step", [1]),
        ("fresh/reset", b"{not json"),
        ("fresh/reset", b""),
    ]
    replies = []
    for fast_routes in (True, False):
        ledger = EnvLedger()
        config = ServerConfig(allowed_env_ids=frozenset({BANDIT, HANG}), fast_routes=fast_routes)
        server = EnvServer(config, make_env=ledger.make)
        with TestClient(server.app, raise_server_exceptions=False) as http:
            ids = {
                name: http.post("/sessions", json={"env_id": env_id, "kwargs": kwargs}).json()["session_ids"][0]
                for name, env_id, kwargs in (("bandit", BANDIT, {"horizon": 5}), ("hang", HANG, {}), ("fresh", BANDIT, {}))
            } | {"unknown-id": "unknown-id"}
            got = []
            for target, body in requests:
                name, verb = target.split("/")
                path = f"/sessions/{ids[name]}/{verb}"
                content = body if isinstance(body, bytes) else json.dumps(body).encode()
                reply = http.post(path, content=content, headers={"content-type": "application/json"})
                text = reply.text.replace(ids[name], "<session>").replace(server.instance_id, "<instance>")
                got.append((reply.status_code, reply.headers["content-type"], reply.headers.get("retry-after"), json.loads(text)))
            ledger.release.set()
            replies.append(got)
    for sent, fast, fastapi in zip(requests, *replies, strict=True):
        assert fast == fastapi, sent
    assert {200, 400, 404, 409, 422, 500} <= {status for status, *_ in replies[0]}
