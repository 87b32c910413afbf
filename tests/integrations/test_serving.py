"""Serving at scale: the WebSocket session endpoint, inline env calls and their watchdog, back-pressure."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("websockets")

from websockets.sync import client as websockets_sync

from rl_llm.envs.base import Outcome, Task, TextEnv
from rl_llm.integrations.generic import EnvFactory
from rl_llm.integrations.http_server import BackgroundServer, EnvServer, ServerConfig
from rl_llm.integrations.inline_calls import InlinePolicy, LoopBatch
from tests.integrations.test_http_server import BANDIT, HANG, TTT, serve, wait_until

SLOW = "test/Slow-v0"


class SlowEnv(TextEnv):
    """Steps take as many seconds as the action says (``"0.05"``), or none for any other text."""

    def __init__(self) -> None:
        super().__init__(max_turns=1000)

    def _reset(self, options: dict[str, Any]) -> Task:
        return Task("say a duration", "slow-0", "test env")

    def _step(self, action: str) -> Outcome:
        if action == "nan":  # a reward strict JSON cannot write
            return Outcome("not a number", {"slept": float("nan")})
        with contextlib.suppress(ValueError):  # any other text: no sleep
            time.sleep(float(action))
        return Outcome(f"slept {action}", {"slept": 1.0})


def ws_call(socket: Any, **message: Any) -> dict[str, Any]:
    socket.send(json.dumps(message))
    return json.loads(socket.recv(timeout=30))


def test_a_websocket_session_plays_like_a_local_env_and_errors_keep_the_connection() -> None:
    with serve() as served:
        url = served.url.replace("http://", "ws://") + "/sessions/ws"
        local = EnvFactory(TTT, opponent="minimax")()
        with websockets_sync.connect(url) as socket:
            assert ws_call(socket, op="step", action="x")["error"]["status"] == 409  # no session yet
            session_id = ws_call(socket, op="create", env_id=TTT, kwargs={"opponent": "minimax"})["session_id"]
            assert ws_call(socket, op="create", env_id=TTT)["error"]["status"] == 409  # one per connection
            assert ws_call(socket, op="step", action="<move>B2</move>")["error"]["status"] == 409  # not reset
            assert ws_call(socket, op="reset", seed="three")["error"]["status"] == 422
            assert ws_call(socket, op="reset", seed=-1)["error"]["status"] == 422  # Gymnasium refuses it: not a 500
            assert ws_call(socket, op="jump")["error"]["status"] == 422
            socket.send("{not json")
            assert json.loads(socket.recv(timeout=30))["error"]["status"] == 422
            assert ws_call(socket, op="reset", seed=5)["observation"] == local.reset(seed=5)[0]
            for move in ("<move>B2</move>", "nonsense", "<move>A1</move>"):
                reply, expected = ws_call(socket, op="step", action=move), local.step(move)
                assert (reply["observation"], reply["reward"], reply["terminated"]) == expected[:3]
                if reply["done"]:
                    break
            assert ws_call(socket, op="close") == {"session_id": session_id, "closed": True}
        assert wait_until(served.ledger.all_closed_once)


def test_a_dropped_websocket_closes_the_session_it_created_but_not_one_it_attached_to() -> None:
    with serve() as served:
        url = served.url.replace("http://", "ws://") + "/sessions/ws"
        kept = served.client.create(BANDIT)[0]
        with websockets_sync.connect(url) as socket:
            ws_call(socket, op="create", env_id=BANDIT)
            assert served.server.snapshot()["live_sessions"] == 2
        with websockets_sync.connect(url) as socket:
            assert ws_call(socket, op="attach", session_id=kept) == {"session_id": kept}
            assert "observation" in ws_call(socket, op="reset", seed=0)
        assert wait_until(lambda: served.server.snapshot()["live_sessions"] == 1)
        assert served.client.reset(kept, seed=1)[0]  # the attached session outlived its connection


# Each op's fields, mistyped, missing or unknown: (op, fields, the field the detail names, the HTTP route taking
# the same fields or None). attach and create go to a connection without a session, the rest to one with one.
BAD_FIELDS = [
    ("attach", {"session_id": None}, "session_id", None),  # was a 404 for a session id 'None'
    ("attach", {}, "session_id", None),
    ("attach", {"session_id": ["a"]}, "session_id", None),
    ("attach", {"session_id": "x", "surprise": 1}, "surprise", None),
    ("create", {"env_id": 5}, "env_id", "/sessions"),
    ("create", {"env_id": TTT, "kwargs": [1]}, "kwargs", "/sessions"),
    ("create", {"env_id": TTT, "count": 2}, "count", None),  # was one session, the count silently ignored
    ("reset", {"seed": True}, "seed", "/sessions/{sid}/reset"),  # true, "5" and 5.0 were seeds
    ("reset", {"seed": "5"}, "seed", "/sessions/{sid}/reset"),
    ("reset", {"seed": 5.0}, "seed", "/sessions/{sid}/reset"),
    ("reset", {"options": [1]}, "options", "/sessions/{sid}/reset"),
    ("step", {"action": 5}, "action", "/sessions/{sid}/step"),
    ("step", {"messages": "hi"}, "messages", "/sessions/{sid}/step"),
    ("step", {"messages": [{"role": 5, "content": "x"}]}, "messages.0.role", "/sessions/{sid}/step"),
    ("close", {"now": True}, "now", None),  # was taken, the field ignored
]


@pytest.mark.parametrize(("op", "fields", "field", "route"), BAD_FIELDS)
def test_websocket_messages_with_bad_fields_are_a_422_naming_the_field_as_over_http(
    op: str, fields: dict[str, Any], field: str, route: str | None
) -> None:
    with serve() as served:
        url = served.url.replace("http://", "ws://") + "/sessions/ws"
        with websockets_sync.connect(url) as socket:
            if op not in ("attach", "create"):
                assert "session_id" in ws_call(socket, op="create", env_id=TTT)
                ws_call(socket, op="reset", seed=1)
            error = ws_call(socket, op=op, **fields)["error"]
            assert error["status"] == 422 and error["detail"].startswith(f"{field}:"), error
            assert "\n" not in error["detail"]
            if op in ("attach", "create"):  # the connection is kept, and can still open its session
                assert "session_id" in ws_call(socket, op="create", env_id=TTT)
            assert "observation" in ws_call(socket, op="reset", seed=1)  # and the session plays on
        if route is not None:  # the same fields over HTTP: FastAPI's 422, naming the same field
            response = httpx.post(served.url + route.format(sid=served.client.create(TTT)[0]), json=fields)
            assert response.status_code == 422, response.text
            assert [".".join(map(str, e["loc"][1:])) for e in response.json()["detail"]] == [field]


def test_inline_policy_promotes_after_a_fast_streak_and_demotes_a_slow_kind_for_longer() -> None:
    policy = InlinePolicy(budget_s=0.001, promote_after=4, max_demotions=2)
    kind = ("env", "step")
    for _ in range(3):
        policy.pooled(kind, 0.0001)
    policy.pooled(kind, 0.01)  # a slow call breaks the streak
    assert not policy.inline(kind)
    for _ in range(4):
        policy.pooled(kind, 0.0001)
    assert policy.inline(kind)
    policy.ran_inline(kind, 0.005)  # slower than the budget but not 10x: stays inline
    policy.ran_inline(kind, 0.02)  # one slow call (a preempted thread, say) is one strike, not a demotion
    for _ in range(64):
        policy.ran_inline(kind, 0.0001)  # 64 fast calls wear off two strikes
    policy.ran_inline(kind, 0.02)
    policy.ran_inline(kind, 0.02)
    assert policy.inline(kind)
    policy.ran_inline(kind, 0.02)
    assert not policy.inline(kind) and policy.demotions == 1
    for _ in range(7):
        policy.pooled(kind, 0.0001)
    assert not policy.inline(kind)  # now it takes twice the streak
    policy.pooled(kind, 0.0001)
    assert policy.inline(kind)
    for _ in range(3):
        policy.ran_inline(kind, 0.02)
    for _ in range(100):
        policy.pooled(kind, 0.0001)
    assert not policy.inline(kind)  # max_demotions reached: the pool for good
    assert not InlinePolicy(budget_s=0).inline(kind)


def test_loop_batch_runs_calls_in_order_a_capped_batch_per_callback_and_skips_cancelled_ones() -> None:
    async def play() -> tuple[list[Any], list[Any]]:
        batch, ran = LoopBatch(cap=2), []

        def call(index: int) -> Any:
            def run() -> int:
                ran.append(index)
                if index == 3:
                    raise ValueError("three")
                if index == 2:
                    raise StopIteration("an env's exhausted iterator")  # a future refuses StopIteration itself
                return 10 * index

            return run

        futures = [batch.run(call(index)) for index in range(6)]
        asyncio.get_running_loop().call_soon(ran.append, "other")  # another connection's callback
        futures[4].cancel()  # its connection went away before its turn: not run at all
        return ran, await asyncio.gather(*futures, return_exceptions=True)

    ran, results = asyncio.run(play())
    # Two per callback; the rest wait behind the callbacks queued meanwhile.
    assert ran == [0, 1, "other", 2, 3, 5]
    assert results[:2] == [0, 10] and results[5] == 50
    assert isinstance(results[2], RuntimeError) and "StopIteration: an env's exhausted iterator" in str(results[2])
    assert isinstance(results[3], ValueError) and isinstance(results[4], asyncio.CancelledError)


def make_slow(env_id: str, kwargs: dict[str, Any]) -> Any:
    return SlowEnv() if env_id == SLOW else EnvFactory(env_id, **kwargs)()


def test_cheap_steps_go_inline_and_a_slow_one_is_caught_by_the_watchdog(caplog: pytest.LogCaptureFixture) -> None:
    server = EnvServer(ServerConfig(allowed_env_ids=frozenset({SLOW})), make_env=make_slow)
    server.inline_policy.warn_after_s = 0.2
    with BackgroundServer(server.app) as background, httpx.Client(base_url=background.url, timeout=30) as http:
        sid = http.post("/sessions", json={"env_id": SLOW}).json()["session_ids"][0]
        http.post(f"/sessions/{sid}/reset", json={})
        for _ in range(server.inline_policy.promote_after + 4):
            assert http.post(f"/sessions/{sid}/step", json={"action": "fast"}).status_code == 200
        stats = http.get("/stats").json()
        assert stats["inline_calls"] == 4 and stats["inline_demotions"] == 0
        with caplog.at_level(logging.WARNING, logger="rl_llm.integrations.env_server"):
            assert http.post(f"/sessions/{sid}/step", json={"action": "0.5"}).json()["observation"] == "slept 0.5"
        assert sid in caplog.text and "blocked the event loop" in caplog.text
        http.post(f"/sessions/{sid}/step", json={"action": "fast"})
        stats = http.get("/stats").json()
        assert stats["inline_demotions"] == 1 and stats["inline_calls"] == 5  # the fast step went to the pool
        assert stats["pool_calls"] == 1 + server.inline_policy.promote_after + 1


def _queue_one_hung_step(served: Any) -> Any:
    """Two sessions; one step that hangs until ``served.ledger.release`` fills the one-slot queue. Returns the
    other session, whose next step the full queue refuses."""
    client, url = served.client, served.url
    hung, other = client.make(HANG), client.make(HANG)
    hung.reset()
    other.reset()
    threading.Thread(target=lambda: httpx.post(f"{url}/sessions/{hung.session_id}/step", json={"action": "hang"},
                                               timeout=60), daemon=True).start()  # fmt: skip
    assert wait_until(lambda: served.server.snapshot()["queued"] == 1)
    return other


def test_a_full_queue_answers_503_with_retry_after_and_max_sessions_429_too() -> None:
    with serve(max_workers=1, max_queued=1, max_sessions=3) as served:
        url = served.url
        other = _queue_one_hung_step(served)
        response = httpx.post(f"{url}/sessions/{other.session_id}/step", json={"action": "x"})
        assert response.status_code == 503 and response.headers["retry-after"] == "1"
        assert "busy" in response.json()["detail"]
        served.ledger.release.set()
        assert wait_until(lambda: served.server.snapshot()["queued"] == 0)
        assert other.step("x")[0] == "echo x"  # back to normal once the queue drains
        response = httpx.post(f"{url}/sessions", json={"env_id": TTT, "count": 2})
        assert response.status_code == 429 and response.headers["retry-after"] == "1"


def test_a_nan_reward_comes_back_as_strict_json_null() -> None:
    server = EnvServer(ServerConfig(allowed_env_ids=frozenset({SLOW})), make_env=make_slow)
    with BackgroundServer(server.app) as background, httpx.Client(base_url=background.url, timeout=30) as http:
        sid = http.post("/sessions", json={"env_id": SLOW}).json()["session_ids"][0]
        http.post(f"/sessions/{sid}/reset", json={})
        response = http.post(f"/sessions/{sid}/step", json={"action": "nan"})
        assert response.status_code == 200 and "NaN" not in response.text
        body = json.loads(response.text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
        assert body["observation"] == "not a number" and body["reward"] is None


def test_websocket_steps_refuse_bad_frames_clearly_and_write_strict_json() -> None:
    server = EnvServer(ServerConfig(allowed_env_ids=frozenset({SLOW})), make_env=make_slow)
    with BackgroundServer(server.app) as background, \
         websockets_sync.connect(background.url.replace("http://", "ws://") + "/sessions/ws") as socket:  # fmt: skip
        ws_call(socket, op="create", env_id=SLOW)
        ws_call(socket, op="reset")
        socket.send(json.dumps({"op": "step", "action": "fast"}).encode())  # a binary frame
        error = json.loads(socket.recv(timeout=30))["error"]
        assert error["status"] == 422 and "text frame" in error["detail"]
        # Steps the one-pass parse refuses go the general way, which says what is wrong.
        error = ws_call(socket, op="step", action="fast", extra=1)["error"]
        assert error["status"] == 422 and error["detail"].startswith("extra:")
        error = ws_call(socket, op="step", action="fast", messages=[{"role": "assistant", "content": "x"}])["error"]
        assert error["status"] == 422 and "exactly one" in error["detail"]
        socket.send(json.dumps({"op": "step", "action": "nan"}))
        text = socket.recv(timeout=30)
        body = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
        assert body["observation"] == "not a number" and body["reward"] is None
        # Hostile JSON: nested past the parser's recursion limit, NaN, a lone surrogate escape.
        for hostile, needle in (("[" * 100_000, "nested too deeply"), ('{"op": "reset", "seed": NaN}', "seed:"),
                                ('{"op": "step", "action": "\\ud800"}', "unicode")):  # fmt: skip
            socket.send(hostile)
            error = json.loads(socket.recv(timeout=30))["error"]
            assert error["status"] == 422 and needle in error["detail"], error
        assert ws_call(socket, op="step", action="fast")["observation"] == "slept fast"  # still serving


def test_the_client_waits_out_a_503_as_retry_after_says_then_succeeds() -> None:
    with serve(max_workers=1, max_queued=1) as served:
        other = _queue_one_hung_step(served)
        threading.Timer(0.3, served.ledger.release.set).start()  # the queue drains while the client waits
        assert other.step("x")[0] == "echo x"
        assert served.server.snapshot()["overloaded"] >= 1  # it was refused first, then retried


@pytest.mark.parametrize("module", ["rl_llm.integrations.http_server", "rl_llm.integrations.openenv"])
def test_websocket_compression_is_off_unless_asked_for(module: str) -> None:
    """Both servers' WebSocket sessions decline permessage-deflate, which clients offer by default (it cost
    more CPU per message and memory per connection than it saved here, docs/serving.md#web-server-settings);
    ``--ws-compression`` negotiates it, and sessions work either way."""
    if module.endswith("openenv"):
        pytest.importorskip("openenv.core", reason="openenv-core: pip install 'rl-llm[openenv]'")
    from tests.integrations.test_serving_faults import free_port, server_process

    path, hello = ("/ws", {"type": "reset", "data": {"seed": 1}}) if module.endswith("openenv") else (
        "/sessions/ws", {"op": "create", "env_id": BANDIT})  # fmt: skip
    for argv, compressed in (((), False), (("--ws-compression",), True)):
        port = free_port()
        with server_process(port, *argv, module=module), \
                websockets_sync.connect(f"ws://127.0.0.1:{port}{path}") as socket:  # fmt: skip
            negotiated = socket.response.headers.get("Sec-WebSocket-Extensions") or ""
            assert ("permessage-deflate" in negotiated) is compressed, negotiated
            socket.send(json.dumps(hello))
            reply = json.loads(socket.recv(timeout=30))
            assert "error" not in reply and reply.get("type") != "error", reply


def test_web_stack_flags_reach_uvicorn_and_a_missing_package_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--loop``/``--http`` become uvicorn's ``loop``/``http``; one that names a package not installed stops
    with the command that installs it (rl-llm[server], which declares both), not with uvicorn's traceback."""
    import argparse
    import importlib.metadata
    import importlib.util

    from rl_llm.integrations.http_server import add_web_server_flags, web_server_options

    parser = argparse.ArgumentParser()
    add_web_server_flags(parser)
    options = web_server_options(parser.parse_args(["--loop", "asyncio", "--http", "h11"]))
    assert (options["loop"], options["http"], options["access_log"]) == ("asyncio", "h11", False)
    assert web_server_options(parser.parse_args([]))["loop"] == "auto"
    declared = " ".join(importlib.metadata.requires("rl-llm") or [])
    assert "uvloop" in declared and "httptools" in declared
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else real_find_spec(name, *a))
    with pytest.raises(SystemExit, match=r"--loop uvloop needs the uvloop package: pip install 'rl-llm\[server\]'"):
        web_server_options(parser.parse_args(["--loop", "uvloop"]))
    web_server_options(parser.parse_args(["--http", "httptools"]))  # the other one is still found


@pytest.mark.parametrize("access_log", [False, True])
def test_websocket_connections_are_logged_only_with_the_access_log(access_log: bool, tmp_path: Any) -> None:
    """uvicorn writes INFO lines for every WebSocket connection (accepted, open, and on some ways of ending,
    closed): an access log by another name, so they follow ``--access-log``; the server's own start-up lines
    are written either way."""
    from tests.integrations.test_serving_faults import free_port

    port, log_path = free_port(), tmp_path / "server.log"
    with log_path.open("wb") as log:
        command = [sys.executable, "-m", "rl_llm.integrations.http_server", "--port", str(port), "--env", BANDIT,
                   *(["--access-log"] if access_log else [])]  # fmt: skip
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            assert wait_until(lambda: "Uvicorn running" in log_path.read_text(), timeout=60), log_path.read_text()
            with websockets_sync.connect(f"ws://127.0.0.1:{port}/sessions/ws") as socket:
                assert "session_id" in ws_call(socket, op="create", env_id=BANDIT)
                assert ws_call(socket, op="close")["closed"] is True
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=30)
        finally:
            process.terminate()
            process.wait(30)
    text = log_path.read_text()
    assert "Application startup complete" in text and "Uvicorn running" in text
    per_connection = ['"WebSocket /sessions/ws" [accepted]', "connection open"]
    assert [line in text for line in per_connection] == [access_log] * 2, text
    assert access_log or "connection closed" not in text, text  # written on some ways a connection ends
    assert ('"GET /health HTTP/1.1" 200' in text) is access_log, text


@pytest.mark.parametrize("module", ["rl_llm.integrations.http_server", "rl_llm.integrations.openenv"])
def test_both_servers_start_serving_on_a_frozen_heap_with_the_garbage_collected_first(
    module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full garbage collection walks every object it tracks, and a server's are mostly start-up objects:
    under load those walks stopped the OpenEnv server's loop for 100-140 ms each. So each server's ``main``
    freezes the heap (``gc.freeze``) just before uvicorn serves, after a collection: an object alive then is
    out of the collector's sight, a cycle that was already garbage is freed rather than kept for good."""
    import gc
    import importlib
    import weakref

    import uvicorn

    if module.endswith("openenv"):
        pytest.importorskip("openenv.core", reason="openenv-core: pip install 'rl-llm[openenv]'")

    class Node:
        pass

    alive, garbage = Node(), Node()
    garbage.cycle = garbage  # only the cycle collector frees it
    garbage_ref = weakref.ref(garbage)
    del garbage
    seen: dict[str, Any] = {}

    def serving(app: Any, **options: Any) -> None:  # uvicorn.run, at the moment it would start serving
        seen.update(port=options["port"], frozen=gc.get_freeze_count(), garbage_freed=garbage_ref() is None,
                    alive_tracked=any(obj is alive for obj in gc.get_objects()))  # fmt: skip

    monkeypatch.setattr(uvicorn, "run", serving)
    gc.disable()  # so that only the server's own collection can free the cycle
    try:
        importlib.import_module(module).main(["--env", BANDIT, "--port", "8123"])
    finally:
        gc.unfreeze()
        gc.enable()
    assert seen["port"] == 8123 and seen["frozen"] > 1000
    assert seen["garbage_freed"] and not seen["alive_tracked"]
    assert any(obj is alive for obj in gc.get_objects())  # unfrozen again: tracked as before


@pytest.mark.parametrize("module", ["rl_llm.integrations.http_server", "rl_llm.integrations.openenv"])
def test_both_servers_run_on_uvloop_by_default_and_on_asyncio_when_told(module: str) -> None:
    """Read from the server process's memory map: uvloop's extension is loaded under the default ``auto``
    (rl-llm[server] installs it) and not under ``--loop asyncio --http h11``; a session works either way."""
    pytest.importorskip("uvloop", reason="uvloop: pip install 'rl-llm[server]'")
    if module.endswith("openenv"):
        pytest.importorskip("openenv.core", reason="openenv-core: pip install 'rl-llm[openenv]'")
    from tests.integrations.test_serving_faults import free_port, server_process

    for argv, on_uvloop in (((), True), (("--loop", "asyncio", "--http", "h11"), False)):
        port = free_port()
        with server_process(port, *argv, module=module) as process:
            if module.endswith("openenv"):
                reply = httpx.post(f"http://127.0.0.1:{port}/reset", json={"seed": 1}, timeout=30).json()
                assert reply["observation"]["text"].startswith("Pull 1 of"), reply
            else:
                sid = httpx.post(f"http://127.0.0.1:{port}/sessions", json={"env_id": BANDIT}, timeout=30).json()
                reply = httpx.post(f"http://127.0.0.1:{port}/sessions/{sid['session_ids'][0]}/reset", json={}, timeout=30)
                assert reply.status_code == 200, reply.text
            with open(f"/proc/{process.pid}/maps") as maps:
                assert ("uvloop" in maps.read()) is on_uvloop, argv


QUOTE = "test/Quote-v0"


class QuoteEnv(TextEnv):
    """Quotes its reset option ``name`` as it came, unescaped: in its observation, or in the ValueError it
    raises when ``refuse`` is set (as an env naming a missing task directory does)."""

    def __init__(self) -> None:
        super().__init__(max_turns=3)

    def _reset(self, options: dict[str, Any]) -> Task:
        if options.get("refuse"):
            raise ValueError(f"no task named {options.get('name')}")
        return Task(f"task {options.get('name')}", "quote-0", "test env")

    def _step(self, action: str) -> Outcome:
        return Outcome("ok", {"r": 1.0})


def test_an_env_quoting_a_lone_surrogate_answers_strict_json_and_keeps_the_session() -> None:
    """A reset option may carry a lone surrogate escape (``"\\ud800"``: valid JSON, not UTF-8) that the env
    quotes back. The reply encoder raised on it: the WebSocket session loop died (connection and session
    lost, a traceback logged) and ``/batch/reset`` and the reset route answered a bare 500."""
    server = EnvServer(ServerConfig(allowed_env_ids=frozenset({QUOTE})), make_env=lambda *_: QuoteEnv())
    echo, refuse = b'{"name": "\\ud800"}', b'{"name": "\\ud800", "refuse": true}'
    strict = {"parse_constant": lambda c: pytest.fail(f"non-strict JSON constant {c}")}
    with BackgroundServer(server.app) as background, httpx.Client(base_url=background.url, timeout=30) as http:
        with websockets_sync.connect(background.url.replace("http://", "ws://") + "/sessions/ws") as socket:
            ws_call(socket, op="create", env_id=QUOTE)
            socket.send(b'{"op": "reset", "options": %s}'.decode() % echo.decode())
            assert json.loads(socket.recv(timeout=30), **strict)["observation"].startswith("task \ufffd")
            socket.send(b'{"op": "reset", "options": %s}'.decode() % refuse.decode())
            error = json.loads(socket.recv(timeout=30), **strict)["error"]
            assert error["status"] == 400 and "no task named \ufffd" in error["detail"]
            assert ws_call(socket, op="reset")["observation"] == "task None"  # the connection and session live on
        sid = http.post("/sessions", json={"env_id": QUOTE}).json()["session_ids"][0]
        headers = {"content-type": "application/json"}
        reply = http.post(f"/sessions/{sid}/reset", content=b'{"options": %s}' % echo, headers=headers)
        assert reply.status_code == 200 and json.loads(reply.text, **strict)["observation"].startswith("task \ufffd")
        batch = b'{"items": [{"session_id": "%s", "options": %s}, {"session_id": "%s", "options": %s}]}'
        sid2 = http.post("/sessions", json={"env_id": QUOTE}).json()["session_ids"][0]
        reply = http.post("/batch/reset", content=batch % (sid.encode(), refuse, sid2.encode(), echo), headers=headers)
        assert reply.status_code == 200, reply.text
        first, second = json.loads(reply.text, **strict)["results"]
        assert first["error"]["status"] == 400 and "no task named \ufffd" in first["error"]["detail"]
        assert second["observation"].startswith("task \ufffd")
        assert http.post(f"/sessions/{sid}/reset", json={}).status_code == 200


def raw_request(url: str, head: bytes, body: bytes = b"") -> bytes:
    """Send ``head`` and ``body`` over a plain socket and read the reply until the server closes or 5 s pass."""
    import socket

    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(head + body)
        reply = b""
        with contextlib.suppress(OSError):
            while chunk := connection.recv(65536):
                reply += chunk
                if b"\r\n\r\n" in reply and b'"detail"' in reply:
                    break
    return reply


def test_a_request_body_over_the_limit_is_refused_413_and_never_held_whole() -> None:
    """The fast routes (and FastAPI, with its own limit off by default) read a body whole: one client posting
    gigabytes grew the server's memory until it was killed, with every session on it. Now: a declared length
    over the limit is refused unread, a chunked body as soon as it passes the limit, on the fast routes and on
    FastAPI's alike; a body under the limit is served as before."""
    with serve(max_body_bytes=4096) as served:
        sid = served.client.create(BANDIT, horizon=3)[0]
        step = f"POST /sessions/{sid}/step HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
        declared = raw_request(served.url, step + b"Content-Length: 1073741824\r\n\r\n", b"{")  # 1 GiB, 1 byte sent
        assert declared.startswith(b"HTTP/1.1 413") and b"request body over 4096 bytes" in declared
        chunk = b"x" * 1000
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(10)) + b"0\r\n\r\n"
        for path in (f"/sessions/{sid}/step", "/sessions"):  # a fast route, and one FastAPI answers
            head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
            reply = raw_request(served.url, head + b"Transfer-Encoding: chunked\r\n\r\n", chunked)
            assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
        served.client.reset(sid, seed=0)  # under the limit: served as before, the session untouched
        observation, _, terminated, truncated, _ = served.client.step(sid, "<action>A</action>")
        assert "Arm A gave reward" in observation and not terminated and not truncated


def test_the_body_limit_flag_takes_positive_mib_only(capsys: pytest.CaptureFixture[str]) -> None:
    """A usage error like every other flag's: exit 2, one line naming it (it exited 1 with its own words)."""
    from rl_llm.integrations.http_server import main

    for bad, why in (("0", "must be positive"), ("-1", "must be positive"), ("nan", "must be a finite number"),
                     ("inf", "must be a finite number"), ("2e6", "must be <= 1048576.0"), ("big", "expected a number")):
        with pytest.raises(SystemExit) as stopped:
            main(["--max-body-mb", bad, "--port", "0"])
        errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
        assert stopped.value.code == 2 and len(errors) == 1 and f"argument --max-body-mb: {why}" in errors[0], errors


@pytest.mark.parametrize("max_bytes", [0, -1, 2.5, True, "1024"])
def test_the_body_limit_refuses_a_bad_size_in_the_checks_words(max_bytes: Any) -> None:
    from rl_llm.integrations.fast_routes import BodyLimit

    with pytest.raises(ValueError, match=r"^max_bytes must be an integer"):
        BodyLimit(None, max_bytes=max_bytes)
