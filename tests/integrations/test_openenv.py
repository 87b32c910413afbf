"""rl-llm envs served by openenv-core's own ``create_app`` on a real uvicorn server, driven by openenv-core's
unmodified ``GenericEnvClient`` (WebSocket sessions, from http:// and ws:// base URLs) and by plain HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.extras import import_extra

import_extra("openenv.core", "openenv", "openenv-core: pip install 'rl-llm[openenv]'")  # fails where CI installed it
import_extra("uvicorn", "openenv", "uvicorn: pip install 'rl-llm[openenv]'")

from openenv.core import GenericEnvClient  # noqa: E402

from rl_llm.integrations.http_server import BackgroundServer  # noqa: E402
from rl_llm.integrations.openenv import create_openenv_app, parse_kwargs  # noqa: E402
from rl_llm.integrations.openenv import main as openenv_main  # noqa: E402

TTT = "rl-llm/TicTacToe-v0"


@pytest.fixture(scope="module")
def ttt_url() -> Iterator[str]:
    with BackgroundServer(create_openenv_app(TTT, {"opponent": "minimax"}, max_sessions=4)) as server:
        yield server.url


@pytest.mark.parametrize("scheme", ["http", "ws"])
def test_generic_client_plays_an_episode(ttt_url: str, scheme: str) -> None:
    url = ttt_url.replace("http", scheme, 1)
    with GenericEnvClient(base_url=url).sync() as env:
        result = env.reset(seed=3)
        observation = result.observation
        assert not result.done and result.reward is None
        assert observation["text"] and "tic-tac-toe" in observation["system_prompt"].lower()
        assert observation["task_id"] and observation["info"]["task_id"] == observation["task_id"]
        for move in ("A1", "A2", "A3", "B1", "B2", "B3", "C1", "C2", "C3"):
            result = env.step({"message": f"<move>{move}</move>"})
            info = result.observation["info"]
            assert set(info) >= {"reward_components", "metrics", "invalid_action", "terminated", "truncated"}
            assert result.reward == pytest.approx(sum(info["reward_components"].values()))
            if result.done:
                break
        assert result.done and result.observation["text"] == ""
        assert result.reward <= 0.0  # minimax never loses
        state = env.state()
        assert state["done"] and state["env_id"] == TTT and state["step_count"] >= 3


def test_bad_input_is_an_error_not_a_dead_session(ttt_url: str) -> None:
    with GenericEnvClient(base_url=ttt_url).sync() as env:
        with pytest.raises(RuntimeError, match="no episode running"):
            env.step({"message": "<move>B2</move>"})
        env.reset(seed=1)
        with pytest.raises(RuntimeError, match=r"VALIDATION_ERROR|validation"):
            env.step({"msg": "<move>B2</move>"})
        with pytest.raises(RuntimeError, match="options must be a JSON object"):
            env.reset(seed=1, options=[1, 2])
        result = env.reset(seed=1)  # the same connection still plays
        result = env.step({"message": "no move here"})
        assert result.observation["info"]["invalid_action"] and not result.done


def test_concurrent_sessions_are_isolated(ttt_url: str) -> None:
    with (
        GenericEnvClient(base_url=ttt_url).sync() as first,
        GenericEnvClient(base_url=ttt_url).sync() as second,
    ):
        first.reset(seed=5)
        second.reset(seed=5)
        a = first.step({"message": "<move>A1</move>"}).observation["text"]
        b = second.step({"message": "<move>C3</move>"}).observation["text"]
        assert a != b
        assert first.state()["step_count"] == 1 and second.state()["step_count"] == 1
        first.step({"message": "<move>xx</move>"})
        assert first.state()["step_count"] == 2 and second.state()["step_count"] == 1


def test_plain_http_endpoints(ttt_url: str) -> None:
    with httpx.Client(base_url=ttt_url, timeout=60) as http:
        schema = http.get("/schema").json()
        assert "message" in schema["action"]["properties"] and "info" in schema["observation"]["properties"]
        assert http.get("/health").status_code == 200
        # Stateless by OpenEnv's design: a step with no episode is a 409, a malformed action a 422.
        assert http.post("/step", json={"action": {"message": "<move>B2</move>"}}).status_code == 409
        assert http.post("/step", json={"action": {"text": "B2"}}).status_code == 422
        assert http.post("/reset", json={"options": "not a dict"}).status_code == 400
        # A whole episode over plain HTTP through episode_id.
        reset = http.post("/reset", json={"seed": 2, "episode_id": "ep-1"})
        assert reset.status_code == 200 and reset.json()["observation"]["text"]
        assert http.post("/step", json={"action": {"message": "hi"}, "episode_id": "nope"}).status_code == 404
        done, steps = False, 0
        for move in ("A1", "A2", "A3", "B1", "B2", "B3", "C1", "C2", "C3"):
            reply = http.post(
                "/step", json={"action": {"message": f"<move>{move}</move>"}, "episode_id": "ep-1"}
            )
            assert reply.status_code == 200, reply.text
            body, steps = reply.json(), steps + 1
            if body["done"]:
                done = True
                break
        assert done and isinstance(body["reward"], float)
        again = http.post("/step", json={"action": {"message": "<move>A1</move>"}, "episode_id": "ep-1"})
        assert again.status_code == 409


def test_social_game_one_seat_per_connection() -> None:
    app = create_openenv_app("social/prisoners_dilemma_v0", {"opponent": "tit_for_tat"}, max_sessions=2)
    with BackgroundServer(app) as server, GenericEnvClient(base_url=server.url).sync() as env:
        result = env.reset(seed=0)
        assert "<A>" in result.observation["text"]
        rewards = []
        while not result.done:
            result = env.step({"message": "<B>"})
            rewards.append(result.reward)
        # Always defecting against tit-for-tat: the temptation payoff once, then mutual defection.
        assert rewards[0] > rewards[1] and len(set(rewards[1:])) == 1
        assert result.observation["info"]["metrics"]["return"] == pytest.approx(sum(rewards))
    # No baseline: the client plays both seats.
    given = create_openenv_app("social/stag_hunt_v0", max_sessions=2)
    with BackgroundServer(given) as server, GenericEnvClient(base_url=server.url).sync() as env:
        env.reset(seed=0)
        with pytest.raises(RuntimeError, match="opponent_action"):
            env.step({"message": "<A>"})
        both_stag = env.step({"message": "<A>", "opponent_message": "<A>"}).reward
        env.reset(seed=0)
        alone = env.step({"message": "<A>", "opponent_message": "<B>"}).reward
        assert both_stag > alone


def test_bad_env_or_kwargs_fail_at_startup() -> None:
    with pytest.raises(ValueError, match="unknown environment"):
        create_openenv_app("rl-llm/Nope-v0")
    with pytest.raises(ValueError, match="opponent"):
        create_openenv_app("social/chicken_v0", {"opponent": "nobody"})
    # A misspelt option names the env's options; a served seat also takes its seat options.
    with pytest.raises(ValueError, match="takes no option 'opponnent'; its options are agent_mark, opponent,"):
        create_openenv_app(TTT, {"opponnent": "minimax"})
    with pytest.raises(ValueError, match="takes no option 'rounds'; its options are seat, opponent, opponent_seed, "
                                         "payoffs, num_rounds"):  # fmt: skip
        create_openenv_app("social/chicken_v0", {"opponent": "tit_for_tat", "seat": "player_1", "rounds": 3})
    with pytest.raises(SystemExit, match=r"^error: cannot serve rl-llm/TicTacToe-v0: .* takes no option 'x'"):
        openenv_main(["--env", TTT, "-k", "x=1"])
    assert parse_kwargs(["opponent=minimax", "max_turns=5", "x=[1]"]) == {
        "opponent": "minimax",
        "max_turns": 5,
        "x": [1],
    }


def test_episode_store_evicts_and_closes() -> None:
    import gymnasium as gym
    from fastapi import HTTPException

    from rl_llm.integrations.openenv import Episode, EpisodeStore

    closed: list[str] = []

    class Recorder(gym.Wrapper):
        def close(self) -> None:
            closed.append(self.spec_name)
            super().close()

    def env(name: str) -> gym.Env:
        wrapped = Recorder(gym.make("rl-llm/MultiArmedBandit-v0"))
        wrapped.spec_name = name
        return wrapped

    store = EpisodeStore(max_episodes=1, ttl_s=600)
    store.put("a", Episode(env("a"), "bandit"))
    store.put("b", Episode(env("b"), "bandit"))  # over the bound: the least recently used goes, closed
    assert closed == ["a"] and store.get("b").env_id == "bandit"
    with pytest.raises(HTTPException) as error:
        store.get("a")
    assert error.value.status_code == 404
    store.put("b", Episode(env("b2"), "bandit"))  # a new episode under the same id replaces (and closes) the old
    assert closed == ["a", "b"]
    store.close()
    assert closed == ["a", "b", "b2"]


def test_openenv_steps_go_inline_once_cheap_and_match_the_pooled_ones() -> None:
    import asyncio

    from rl_llm.integrations.inline_calls import InlinePolicy
    from rl_llm.integrations.openenv import RLLMAction, RLLMEnvironment

    policy = InlinePolicy(promote_after=4)
    pooled_env, inline_env = (RLLMEnvironment("rl-llm/MultiArmedBandit-v0", {"horizon": 30}, inline=p)
                              for p in (InlinePolicy(budget_s=0), policy))  # fmt: skip

    async def play(env: RLLMEnvironment) -> list[tuple[str, float | None, bool]]:
        first = await env.reset_async(seed=3)
        steps = [await env.step_async(RLLMAction(message=f"<action>{'ABCDE'[i % 5]}</action>")) for i in range(12)]
        return [(o.text, o.reward, o.done) for o in [first, *steps]]

    assert asyncio.run(play(inline_env)) == asyncio.run(play(pooled_env))
    assert policy.inline(("rl-llm/MultiArmedBandit-v0", "step"))  # 12 cheap steps: the later ones ran inline
    assert not policy.inline(("rl-llm/MultiArmedBandit-v0", "reset"))  # one reset is no streak


def test_a_client_that_hangs_up_ends_its_session_without_an_error_log() -> None:
    """openenv-core closes the socket after a session ends; when the client has already hung up, that close
    raised, and uvicorn logged "Exception in ASGI application" with a traceback for every session."""
    import json
    import logging
    import socket
    import time

    from websockets.sync.client import connect

    errors: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = errors.append  # type: ignore[method-assign]
    uvicorn_errors = logging.getLogger("uvicorn.error")
    capacity = 2
    try:
        with BackgroundServer(create_openenv_app(TTT, {"opponent": "minimax"}, max_sessions=capacity)) as server:
            uvicorn_errors.addHandler(handler)  # after the start: uvicorn's logging config drops earlier handlers
            for _ in range(3):
                with GenericEnvClient(base_url=server.url).sync() as env:  # says goodbye, then hangs up
                    env.reset(seed=0)
            for _ in range(capacity):  # hangs up without a goodbye: the TCP connection just drops
                with connect(server.url.replace("http", "ws", 1) + "/ws") as dropped:
                    dropped.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
                    assert json.loads(dropped.recv(timeout=10))["type"] == "observation"
                    dropped.socket.shutdown(socket.SHUT_RDWR)  # no close frame
            deadline, free = time.monotonic() + 10, False
            while not free and time.monotonic() < deadline:  # every session has ended: all seats free again
                sessions = [GenericEnvClient(base_url=server.url).sync() for _ in range(capacity)]
                try:
                    for session in sessions:
                        session.reset(seed=2)
                    free = True
                except RuntimeError:  # CAPACITY_REACHED: the dropped ones are still ending
                    time.sleep(0.1)
                finally:
                    for session in sessions:
                        session.close()
            assert free, "the dropped sessions were never freed"
            time.sleep(0.3)  # the last sessions' own ends
    finally:
        uvicorn_errors.removeHandler(handler)
    assert [record.getMessage() for record in errors] == []


def differential_requests() -> list[tuple[str, Any]]:
    """(path, body) pairs covering every reply the plain-HTTP routes give: whole episodes, the env's own
    errors, and the requests the fast path leaves to openenv-core (raw bytes are sent as they are)."""
    steps = [("/step", {"action": {"message": f"<move>{move}</move>"}, "episode_id": "ep"})
             for move in ("A1", "B2", "A2", "C3", "A3", "C1", "B1", "C2", "B3")]  # fmt: skip
    return [
        ("/reset", {"seed": 5, "episode_id": "ep", "extra": [1, "x"]}),  # extra fields are allowed
        *steps[:2],
        ("/step", {"action": {"message": "no move in here é中"}, "episode_id": "ep", "timeout_s": 3.0}),  # invalid action
        *steps[2:],
        ("/step", {"action": {"message": "<move>A1</move>"}, "episode_id": "ep"}),  # the episode has ended: 409
        ("/reset", {"seed": 6}),  # no episode_id: a fresh env per request
        ("/step", {"action": {"message": "<move>A1</move>"}}),  # no episode: 409
        ("/step", {"action": {"message": "<move>A1</move>"}, "episode_id": "never"}),  # 404
        ("/reset", {"options": "not a dict"}),  # 400 from the env
        ("/reset", {"seed": 1, "options": {"task_index": "x"}}),  # the env rejects the option: 400
        ("/reset", {"seed": 2, "self": 1}),  # an extra field named like the method's own argument: 200
        ("/step", {"action": {"message": "<move>A1</move>"}, "episode_id": ["ep"]}),  # not a string: 422
        ("/step", {"action": {"message": "<move>A1</move>"}, "self": 1}),  # 409: no episode (not a TypeError)
        ("/step", {"action": {"message": "<move>A1</move>", "opponent_message": "x"}, "episode_id": "ep"}),  # 400
        # Left to openenv-core's routes: its own validation errors (422) and defaults.
        ("/reset", {"seed": -1}),
        ("/reset", {"episode_id": "x" * 300}),
        ("/reset", [1, 2]),
        ("/reset", b"{not json"),
        ("/step", {"action": {"text": "B2"}}),
        ("/step", {"action": {"message": 5}}),
        ("/step", {"action": "B2"}),
        ("/step", {"action": {"message": "<move>A1</move>"}, "timeout_s": -1}),
        ("/step", {}),
    ]


def test_fast_path_answers_exactly_as_openenv_core_routes() -> None:
    """Every request of ``differential_requests`` gets the same status, content type and JSON body from the
    app with the plain-HTTP fast path as from openenv-core's own routes (the same seeded episodes)."""
    from fastapi.testclient import TestClient

    replies = []
    for fast_path in (True, False):
        app = create_openenv_app(TTT, {"opponent": "minimax"}, max_sessions=4, fast_path=fast_path)
        with TestClient(app, raise_server_exceptions=False) as client:
            got = []
            for path, body in differential_requests():
                if isinstance(body, bytes):
                    reply = client.post(path, content=body, headers={"content-type": "application/json"})
                else:
                    reply = client.post(path, json=body)
                got.append((path, reply.status_code, reply.headers["content-type"], reply.json()))
            replies.append(got)
    fast, core = replies
    for sent, one, other in zip(differential_requests(), fast, core, strict=True):
        assert one == other, sent
    statuses = [status for _, status, _, _ in fast]
    assert statuses.count(200) >= 5 and {400, 404, 409, 422} <= set(statuses)  # the table covers every kind


def ws_differential_messages() -> list[str]:
    """A ``/ws`` session's messages, each answered by exactly one reply: whole seeded episodes (with and
    without an ``episode_id``), steps before a reset and after the end, the env's own refusals (bad options,
    a bad seed, an opponent message in a non-social game, unknown reset arguments), messages openenv-core's
    models refuse, hostile JSON, other message types, and, last, a message that ends the session."""

    def message(kind: str, data: Any = None, **extra: Any) -> str:
        return json.dumps({"type": kind, **({} if data is None else {"data": data}), **extra})

    def moves(*cells: str) -> list[str]:
        return [message("step", {"message": f"<move>{cell}</move>"}) for cell in cells]

    whole_game = moves("A1", "A2", "A3", "B1", "B2", "B3", "C1", "C2", "C3")  # minimax ends it early; the rest 409
    return [
        message("step", {"message": "<move>B2</move>"}),  # no episode yet
        message("reset", {"seed": 3}),  # the first reset: openenv-core's own, which hands over the session env
        *moves("B2", "B2", "nonsense"),  # a move, the same cell again, an invalid action
        message("reset", {"seed": 5, "options": [1]}),
        message("reset", {"seed": -1}),
        message("reset", {"seed": "abc"}),
        message("reset", {"seed": 1, "self": 2}),
        '{"type": "reset", "data": {"seed": NaN}}',
        message("reset", {"seed": 4, "episode_id": "e1"}),
        *whole_game,
        message("reset", {"seed": 6, "options": {"task_index": 0}}),  # refused: TicTacToe has no such option
        message("reset", {"seed": 6, "options": {"agent_mark": "X"}}),
        message("step", {"message": "<move>A1</move>", "opponent_message": "<move>B2</move>"}),
        message("step", {"message": 5}),
        message("step", {"text": "B2"}),
        message("step"),
        message("step", {"message": "<move>C3</move>"}, extra=1),
        message("step", {"message": "<move>C3</move>", "type": "call_tool"}),
        '{"type": "step", "data": {"message": "\\ud800<move>C1</move>"}}',
        "[" * 5000,
        "not json",
        message("bogus"),
        message("state"),
        message("reset"),
        *whole_game,
        message("state"),
        json.dumps([1, 2]),  # not an object: openenv-core ends the session with SESSION_ERROR
    ]


def test_ws_fast_path_answers_exactly_as_openenv_core() -> None:
    """Every message of ``ws_differential_messages`` gets the same reply, byte for byte, from ``/ws`` with the
    fast path (``OpenEnvSocket`` answering resets and steps) as from openenv-core's own handler, and the fast
    path did answer most of them."""
    from fastapi.testclient import TestClient

    from rl_llm.integrations.openenv_ws import OpenEnvSocket

    replies, answered = [], []
    for fast_path in (True, False):
        app = create_openenv_app(TTT, {"opponent": "minimax"}, max_sessions=4, fast_path=fast_path)
        with TestClient(app) as client, client.websocket_connect("/ws") as socket:
            got = []
            for text in ws_differential_messages():
                socket.send_text(text)
                got.append(socket.receive_text())
            replies.append(got)
            layer = app.middleware_stack
            while not isinstance(layer, OpenEnvSocket):
                layer = layer.app
            answered.append(layer.answered)
    fast, core = replies
    for sent, one, other in zip(ws_differential_messages(), fast, core, strict=True):
        assert one == other, sent[:80]
    kinds = [json.loads(reply)["type"] for reply in fast]
    codes = {json.loads(reply)["data"].get("code") for reply in fast}
    assert kinds.count("observation") >= 12 and {"EXECUTION_ERROR", "VALIDATION_ERROR", "INVALID_JSON"} <= codes
    assert answered[1] == 0 and answered[0] >= 20  # with fast_path=False everything is openenv-core's


def test_ws_fast_path_keeps_each_connection_to_its_own_env() -> None:
    """Two ``/ws`` sessions played in turns on the fast path: each gets exactly the replies it gets alone from
    openenv-core's handler (the fast path answers a message with the env of the connection that sent it)."""
    from fastapi.testclient import TestClient

    def session(seed: int) -> list[str]:
        return [json.dumps({"type": "reset", "data": {"seed": seed}})] + [
            json.dumps({"type": "step", "data": {"message": f"<move>{cell}</move>"}}) for cell in ("B2", "A1", "C3")
        ] + [json.dumps({"type": "state"})]  # fmt: skip

    def reply(socket: Any, text: str) -> str:
        socket.send_text(text)
        return socket.receive_text()

    sessions = [session(3) + session(8), session(5) + session(1)]
    alone = []
    with TestClient(create_openenv_app(TTT, {"opponent": "minimax"}, max_sessions=4, fast_path=False)) as client:
        for messages in sessions:
            with client.websocket_connect("/ws") as socket:
                alone.append([reply(socket, text) for text in messages])
    together: list[list[str]] = [[], []]
    app = create_openenv_app(TTT, {"opponent": "minimax"}, max_sessions=4)
    with TestClient(app) as client, client.websocket_connect("/ws") as first, client.websocket_connect("/ws") as second:
        for turn in range(len(sessions[0])):
            for index, socket in enumerate((first, second)):
                together[index].append(reply(socket, sessions[index][turn]))
    assert together == alone
    assert alone[0] != alone[1]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(st.characters(exclude_categories=["Cs"])),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(st.characters(exclude_categories=["Cs"])), task_id=st.none() | st.text(max_size=8),
    stop=st.lists(st.text(max_size=4), max_size=3), info=st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    reward=st.none() | st.floats(), done=st.booleans(),
)  # fmt: skip
def test_the_fast_paths_write_what_openenv_core_writes_of_the_observation(
    text: str, task_id: str | None, stop: list[str], info: dict[str, Any], reward: float | None, done: bool
) -> None:
    """The fast paths write an observation's wire form directly (``wire_form``) instead of building the model and
    dumping it twice; for any field values (NaN and infinities, big integers, any text) the bytes are
    openenv-core's own: its ``ResetResponse``/``StepResponse`` over HTTP, its ``WSObservationResponse`` over /ws."""
    from openenv.core.env_server.serialization import serialize_observation
    from openenv.core.env_server.types import ResetResponse, StepResponse, WSObservationResponse
    from pydantic_core import to_json

    from rl_llm.integrations.openenv import Episode, RLLMObservation, observation_fields, wire_form

    episode = Episode(env=None, env_id=TTT, task_id=task_id, system_prompt=text[::-1], stop=stop)  # type: ignore[arg-type]
    fields = observation_fields(text, episode, info, done=done, reward=reward)
    wire = wire_form(fields)
    core = serialize_observation(RLLMObservation(**fields))
    assert to_json(wire, inf_nan_mode="null") == StepResponse(**core).model_dump_json().encode()
    assert to_json(wire, inf_nan_mode="null") == ResetResponse(**core).model_dump_json().encode()
    ws = to_json({"type": "observation", "data": wire}, inf_nan_mode="null").decode()
    assert ws == WSObservationResponse(data=core).model_dump_json()


def test_fast_path_leaves_other_content_types_and_routes_to_openenv_core() -> None:
    from fastapi.testclient import TestClient

    with TestClient(create_openenv_app(TTT, max_sessions=2)) as client:
        # A form body is not JSON: openenv-core's route answers (FastAPI's 422 for the missing body).
        form = client.post("/step", content=b"action=B2", headers={"content-type": "application/x-www-form-urlencoded"})
        assert form.status_code == 422 and form.json()["detail"][0]["loc"][0] == "body"
        assert client.get("/reset").status_code == 405  # only POST is a reset
        assert client.post("/reset").json()["observation"]["text"]  # no body: openenv-core's default request
        assert client.get("/health").status_code == 200


def test_hostile_json_gets_an_error_and_leaves_the_session_alive() -> None:
    """Nesting past the JSON parser's recursion limit, NaN and infinities, lone surrogate escapes: each once
    ended an OpenEnv ``/ws`` session or came back over HTTP as a bare 500 with a traceback in the log."""
    from fastapi.testclient import TestClient

    with TestClient(create_openenv_app(TTT, {"opponent": "minimax"}, max_sessions=2)) as client:
        for body, status in ((b'{"seed": NaN}', 422), (b'{"seed": 1e400}', 422), (b"[" * 100_000, 400),
                             (b'{"action": {"message": "\\ud800"}}', 422)):  # fmt: skip
            path = "/step" if b"action" in body else "/reset"
            reply = client.post(path, content=body, headers={"content-type": "application/json"})
            assert reply.status_code == status and "detail" in reply.json(), (body[:30], reply.text[:200])
        with client.websocket_connect("/ws") as socket:
            socket.send_text(json.dumps({"type": "reset", "data": {"seed": 1}}))
            assert socket.receive_json()["type"] == "observation"
            socket.send_text("[" * 100_000)
            assert socket.receive_json()["data"]["code"] == "INVALID_JSON"
            # A lone surrogate reaches the env as U+FFFD (an invalid move here); a valid pair, an emoji, as it is.
            for message in ('{"type": "step", "data": {"message": "\\ud800"}}',
                            '{"type": "step", "data": {"message": "\\ud83d\\ude00"}}'):  # fmt: skip
                socket.send_text(message)
                reply = socket.receive_json()
                assert reply["type"] == "observation" and reply["data"]["observation"]["info"]["invalid_action"], reply
            socket.send_text(json.dumps({"type": "step", "data": {"message": "<move>B2</move>"}}))
            assert socket.receive_json()["type"] == "observation"  # the same session, still playing


def test_odd_request_fields_are_answered_not_a_500() -> None:
    """openenv-core passes every field of a request to the env's methods (its requests allow extra fields, and
    the env takes ``**kwargs``): a field named ``self`` raised TypeError (multiple values for 'self'), and an
    ``episode_id`` that is a list or an object raised TypeError in the episode store (unhashable); each was a
    bare 500 with a traceback over HTTP, with and without the fast path."""
    from fastapi.testclient import TestClient

    for fast_path in (True, False):
        app = create_openenv_app(TTT, {"opponent": "minimax"}, max_sessions=2, fast_path=fast_path)
        with TestClient(app, raise_server_exceptions=False) as client:
            assert client.post("/reset", json={"seed": 1, "self": 2, "episode_id": "e"}).status_code == 200
            step = {"action": {"message": "<move>B2</move>"}, "episode_id": "e", "self": 2}
            assert client.post("/step", json=step).json()["observation"]["text"]
            for odd in (["e"], {"id": "e"}, 5):
                reply = client.post("/step", json={**step, "episode_id": odd})
                assert reply.status_code == 422 and "episode_id must be a string" in reply.json()["detail"], reply.text
            with client.websocket_connect("/ws") as socket:
                socket.send_text(json.dumps({"type": "reset", "data": {"seed": 1, "self": 2}}))
                assert socket.receive_json()["type"] == "observation"
                socket.send_text(json.dumps({"type": "reset", "data": {"episode_id": ["e"]}}))
                assert "episode_id must be a string" in socket.receive_json()["data"]["message"]


def test_a_reset_of_an_episode_id_mid_step_closes_the_old_env_only_after_that_step() -> None:
    """Plain HTTP: a client resetting its ``episode_id`` while a step of it still runs (a retry after its own
    timeout) replaces the episode. The old env used to be closed at once, under the running step (a sandbox
    torn down mid-command); now it closes when that step ends, and the step answers normally."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from rl_llm.envs.base import Outcome, Task, TextEnv
    from rl_llm.integrations.openenv import EpisodeStore, RLLMAction, RLLMEnvironment

    entered, release = threading.Event(), threading.Event()
    envs: list[Any] = []

    class GateEnv(TextEnv):
        """Its step waits for ``release``; records whether it was closed while a step ran."""

        def __init__(self) -> None:
            super().__init__(max_turns=5)
            self.stepping = self.closed = self.closed_mid_step = False
            envs.append(self)

        def _reset(self, options: dict[str, Any]) -> Task:
            return Task("go", "gate-0", "test env")

        def _step(self, action: str) -> Outcome:
            self.stepping = True
            entered.set()
            release.wait(10)
            self.stepping = False
            return Outcome("ok", {"r": 1.0})

        def close(self) -> None:
            self.closed_mid_step |= self.stepping
            self.closed = True
            super().close()

    store = EpisodeStore()
    first, second = RLLMEnvironment("test/Gate-v0", store=store), RLLMEnvironment("test/Gate-v0", store=store)
    first._build = second._build = GateEnv  # the env factory, not the thing under test
    first.reset(seed=0, episode_id="e")
    with ThreadPoolExecutor(1) as pool:
        step = pool.submit(first.step, RLLMAction(message="x"), episode_id="e")
        assert entered.wait(10)
        second.reset(seed=0, episode_id="e")  # the same id, mid-step
        assert not envs[0].closed  # its step is still running
        release.set()
        assert step.result(10).reward == 1.0
    assert envs[0].closed and not envs[0].closed_mid_step and not envs[1].closed
    assert second.step(RLLMAction(message="x"), episode_id="e").reward == 1.0  # the new episode plays on
    store.close()
    assert envs[1].closed


def test_a_request_body_over_the_limit_is_refused_413() -> None:
    """openenv-core's routes and the fast routes read a body whole (FastAPI's own limit is off by default):
    one client posting gigabytes grew the server's memory. Past ``max_body_bytes`` now: 413, read no further."""
    from tests.integrations.test_serving import raw_request

    with BackgroundServer(create_openenv_app(TTT, max_sessions=2, max_body_bytes=4096)) as server:
        chunk = b"x" * 1000
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(10)) + b"0\r\n\r\n"
        for path in ("/step", "/reset"):
            head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
            reply = raw_request(server.url, head + b"Transfer-Encoding: chunked\r\n\r\n", chunked)
            assert reply.startswith(b"HTTP/1.1 413") and b"request body over 4096 bytes" in reply, reply[:200]
            declared = raw_request(server.url, head + b"Content-Length: 1073741824\r\n\r\n", b"{")
            assert declared.startswith(b"HTTP/1.1 413"), declared[:200]
        assert httpx.post(server.url + "/reset", json={"seed": 1}, timeout=30).status_code == 200  # under it: as before
    with pytest.raises(SystemExit) as stopped:
        openenv_main(["--env", TTT, "--max-body-mb", "0"])
    assert stopped.value.code == 2
