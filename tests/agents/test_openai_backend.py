"""The openai backend against a real OpenAI-compatible HTTP server on 127.0.0.1 (a stub model)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_llm.agents.aio import run_sync
from rl_llm.agents.http_client import BackendError
from rl_llm.agents.llm import GenerationRequest
from rl_llm.agents.openai_backend import OpenAIPolicy, restore_stop
from rl_llm.agents.rollout import collect
from rl_llm.types import Message
from tests.agents.stub_servers import ChatStub
from tests.cli_env import cli_env

TICTACTOE = "rl-llm/TicTacToe-v0"


@pytest.fixture
def stub() -> Iterator[ChatStub]:
    server = ChatStub()
    yield server
    server.close()


def policy_for(server: ChatStub, **options) -> OpenAIPolicy:
    options.setdefault("backoff_s", 0.01)
    return OpenAIPolicy(server.url, "stub-model", api_key="sk-test", **options)


def test_plays_whole_episodes_with_the_env_system_prompt_and_stop_strings(stub: ChatStub) -> None:
    policy = policy_for(stub)
    trajectories = collect(TICTACTOE, policy, seeds=[0, 1, 2], group_size=2, env_kwargs={"opponent": "random"})
    assert len(trajectories) == 6
    for trajectory in trajectories:
        assert trajectory.error is None and trajectory.terminated
        assert trajectory.token_ids == []  # a chat API gives text, not tokens
        assert all(turn.action.endswith("</move>") for turn in trajectory.turns), "the cut stop string is restored"
        assert not any(turn.invalid_action for turn in trajectory.turns)
    first = stub.requests[0]
    assert first["path"] == "/v1/chat/completions"
    assert first["headers"]["Authorization"] == "Bearer sk-test"
    body = first["body"]
    assert body["model"] == "stub-model" and body["stop"] == ["</move>"] and body["max_tokens"] == 256
    assert body["messages"][0]["role"] == "system" and "tic-tac-toe" in body["messages"][0]["content"]
    policy.close()


def test_a_timeout_is_retried_and_the_episode_completes() -> None:
    server = ChatStub(failures=["timeout"], slow_s=2.0)
    try:
        policy = policy_for(server, timeout_s=0.3, max_retries=2)
        (trajectory,) = collect(TICTACTOE, policy, seeds=[4])
        assert trajectory.error is None and trajectory.terminated
        assert len(server.requests) == len(trajectory.turns) + 1  # the timed-out request was sent again
    finally:
        server.close()


def test_persistent_http_500s_end_episodes_with_a_clear_error_and_lose_none() -> None:
    server = ChatStub(failures=["500"] * 1000)
    try:
        policy = policy_for(server, max_retries=1)
        trajectories = collect(TICTACTOE, policy, seeds=[0, 1, 2, 3], group_size=2)
        assert len(trajectories) == 8
        assert [t.seed for t in trajectories] == [0, 0, 1, 1, 2, 2, 3, 3]
        for trajectory in trajectories:
            assert trajectory.end_reason == "error" and trajectory.truncated
            assert "HTTP 500" in trajectory.error and "after 2 attempt(s)" in trajectory.error
            assert "scripted 500" in trajectory.error, "the server's own message is kept"
            assert trajectory.task_id, "what was known before the failure is kept"
    finally:
        server.close()


def test_malformed_responses_are_retried_then_reported() -> None:
    server = ChatStub(failures=["not-json", "no-choices"])
    try:
        completion = policy_for(server, max_retries=2).act([[Message("user", "Legal moves: C3")]])[0]
        assert completion.text == "I take C3. <move>C3"  # no stop strings were asked for: nothing is added
        server.failures.extend(["no-choices"])
        with pytest.raises(BackendError, match=r"malformed response \(no 'choices' list\)"):
            policy_for(server, max_retries=0).act([[Message("user", "hi")]])
        server.failures.extend(["not-json"])
        with pytest.raises(BackendError, match=r"malformed response.*502 Bad Gateway"):
            policy_for(server, max_retries=0).act([[Message("user", "hi")]])
    finally:
        server.close()


def test_a_bad_request_is_not_retried(stub: ChatStub) -> None:
    stub.failures.extend(["400", "400"])
    with pytest.raises(BackendError, match=r"HTTP 400: .*scripted 400"):
        policy_for(stub, max_retries=3).act([[Message("user", "hi")]])
    assert len(stub.requests) == 1


def test_an_unreachable_server_gives_a_connection_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    policy = OpenAIPolicy(f"http://127.0.0.1:{port}/v1", "m", max_retries=1, backoff_s=0.01)
    request = GenerationRequest([Message("user", "hi")])
    with pytest.raises(BackendError, match="connection failed"):
        run_sync(policy.agenerate(request))
    with pytest.raises(ValueError, match="http"):
        OpenAIPolicy("localhost:8000", "m")


def test_concurrent_requests_share_one_client(stub: ChatStub) -> None:
    policy = policy_for(stub)

    async def many() -> list:
        requests = [GenerationRequest([Message("user", f"Legal moves: A{i % 3 + 1}")], stop=("</move>",)) for i in range(20)]
        return await asyncio.gather(*(policy.agenerate(r) for r in requests))

    completions = run_sync(many())
    assert [c.text for c in completions] == [f"I take A{i % 3 + 1}. <move>A{i % 3 + 1}</move>" for i in range(20)]


@pytest.mark.parametrize(("text", "stops", "reason", "expected"), [
    ("<move>B2", ("</move>",), None, "<move>B2</move>"),
    ("<move>B2</move>", ("</move>",), None, "<move>B2</move>"),
    ("<sql>SELECT 1", ("</sql>", "</answer>"), None, "<sql>SELECT 1</sql>"),
    ("<answer>x</answer> <sql>q", ("</sql>", "</answer>"), None, "<answer>x</answer> <sql>q</sql>"),
    ("plain text", ("</move>",), None, "plain text"),
    ("plain text", ("STOP",), "STOP", "plain textSTOP"),
    ("plain text", (), None, "plain text"),
])  # fmt: skip
def test_the_stop_string_cut_by_the_api_is_put_back(text: str, stops: tuple, reason: str | None, expected: str) -> None:
    assert restore_stop(text, stops, reason) == expected


def test_rl_llm_eval_with_an_openai_agent_writes_table_jsonl_and_plot(stub: ChatStub, tmp_path: Path) -> None:
    out = tmp_path / "eval.jsonl"
    command = [sys.executable, "-m", "rl_llm.cli", "eval", "TicTacToe", "--agent", f"openai:{stub.url}#stub-model",
               "--episodes", "5", "--seed", "2", "--out", str(out)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=cli_env(COLUMNS="200"))
    assert result.returncode == 0, result.stderr
    assert "return" in result.stdout and "±" in result.stdout
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["seed"] for r in records] == [2, 3, 4, 5, 6]
    assert all(r["error"] is None and r["agent"].startswith("openai:") for r in records)
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    assert len(out.with_suffix(".trajectories.jsonl").read_text().splitlines()) == 5


def test_rl_llm_eval_whose_every_episode_failed_exits_non_zero(tmp_path: Path) -> None:
    # The server is down (nothing listens on the port): the table of zeros measures nothing, so a script
    # running `rl-llm eval` must not take it for a result.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "eval.jsonl"
    command = [sys.executable, "-m", "rl_llm.cli", "eval", "TicTacToe", "--agent", f"openai:http://127.0.0.1:{port}/v1#m",
               "--episodes", "2", "--out", str(out)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=cli_env(COLUMNS="200"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "error: every episode (2) ended on an error" in result.stdout and "Traceback" not in result.stderr
    assert "connection failed" in result.stdout  # the first error, in the warning line
    assert [json.loads(line)["error"] is not None for line in out.read_text().splitlines()] == [True, True]
