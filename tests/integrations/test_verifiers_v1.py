"""The current verifiers API (verifiers >= 0.4, ``verifiers.v1``): the taskset, the hub package loaded by
verifiers' own loader, and whole episodes run by ``vf-eval`` against a scripted OpenAI-compatible model on
127.0.0.1 (the real-vLLM run is in test_verifiers_hub.py). verifiers 0.2 cannot share a venv with 0.4: .ci/run
runs this file in a venv of its own (``pip install -e '.[verifiers]'``) with RL_LLM_REQUIRE_EXTRAS=verifiers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from tests.extras import import_extra, required_extras

INSTALL = "verifiers>=0.4 (the verifiers.v1 API): pip install 'rl-llm[verifiers]'"
import_extra("verifiers", "verifiers", INSTALL)
if "verifiers" not in required_extras():  # verifiers 0.2 has a verifiers.v1 of its own: the release decides
    from importlib.metadata import version

    from packaging.version import Version

    if Version(version("verifiers")) < Version("0.4"):
        pytest.skip(f"needs {INSTALL}; verifiers {version('verifiers')} is installed", allow_module_level=True)

# After the checks above (ruff knows only pytest.importorskip as a guard, hence the noqa).
import verifiers.v1 as vf  # noqa: E402

from rl_llm.integrations.verifiers_hub import write_hub_package  # noqa: E402
from rl_llm.integrations.verifiers_v1 import REWARD, RLLMEnv, RLLMTaskset, RLLMTasksetConfig  # noqa: E402
from tests.agents.stub_servers import ChatStub  # noqa: E402
from tests.integrations.verifiers_eval import assistant_turns, replay, run_vf_eval, verifiers_python  # noqa: E402

BANDIT = "rl-llm/MultiArmedBandit-v0"
TICTACTOE = "rl-llm/TicTacToe-v0"


def test_taskset_holds_the_env_opening_for_each_seed() -> None:
    config = RLLMTasksetConfig(env_id=BANDIT, env_kwargs={"horizon": 4}, num_tasks=3, seed=10)
    tasks = list(RLLMTaskset(config))
    assert [(task.data.idx, task.data.seed) for task in tasks] == [(0, 10), (1, 11), (2, 12)]
    reference = gym.make(BANDIT, horizon=4)
    for task in tasks:
        observation, info = reference.reset(seed=task.data.seed)
        assert (task.data.prompt, task.data.system_prompt) == (observation, info["system_prompt"])
        assert task.data.task_id == info["task_id"] and task.data.env_kwargs == {"horizon": 4}
    assert len({task.key for task in tasks}) == 3  # verifiers requires unique keys within a taskset


def test_hub_package_loads_through_verifiers_own_loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = write_hub_package(TICTACTOE, tmp_path, opponent="minimax")
    monkeypatch.syspath_prepend(str(package))
    config = vf.resolve_env_config({"taskset": {"id": "rl-llm-tic-tac-toe", "num_tasks": 2, "seed": 3}})
    env = vf.load_environment(config)
    assert isinstance(env, RLLMEnv)
    assert config.agent.harness.id == "null"  # the tool-less chat loop: the reply is the action text
    tasks = list(env.taskset)
    assert [task.data.seed for task in tasks] == [3, 4]
    assert tasks[0].data.env_id == TICTACTOE and tasks[0].data.env_kwargs == {"opponent": "minimax"}
    # The command line overrides the package's defaults, as for any verifiers taskset.
    config = vf.resolve_env_config({"taskset": {"id": "rl-llm-tic-tac-toe", "num_tasks": 1,
                                                "env_kwargs": {"opponent": "random"}}})  # fmt: skip
    assert next(iter(vf.load_environment(config).taskset)).data.env_kwargs == {"opponent": "random"}


class StreamingChatStub(ChatStub):
    """The scripted tic-tac-toe player of the backend tests (first legal move; ``<A>`` in a matrix game), writing
    the closing tag itself
    (as a model does when no stop string is asked for: verifiers' chat harness sends none), and answering
    ``stream: true`` requests as server-sent events, which verifiers' interception server relays."""

    def respond(self, path: str, body: dict[str, Any]) -> tuple[int, Any, float]:
        for message in body["messages"]:
            if isinstance(message.get("content"), list):  # content parts: the text ones
                message["content"] = "".join(part.get("text", "") for part in message["content"])
        reply = ChatStub._reply(body)
        text = reply["choices"][0]["message"]["content"] + "</move>"
        if "play <A> or <B>" in body["messages"][-1]["content"]:  # a matrix game's round: cooperate
            text = "I play A. <A>"
        if not body.get("stream"):
            reply["choices"][0]["message"]["content"] = text
            return 200, reply, 0.0
        chunk = {"id": reply["id"], "object": "chat.completion.chunk", "created": 0, "model": body["model"]}
        events = [
            {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": None}]},
            {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {**chunk, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}},
        ]
        data = "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"
        return 200, data.encode(), 0.0


def test_vf_eval_plays_whole_episodes_scored_by_the_env(tmp_path: Path) -> None:
    server = StreamingChatStub()
    try:
        kwargs = {"opponent": "minimax"}
        traces = run_vf_eval(verifiers_python(), TICTACTOE, kwargs, tmp_path, server.url, "stub", num_tasks=2,
                             rollouts=2, max_tokens=16)  # fmt: skip
    finally:
        server.close()
    for trace in traces:
        assert trace["ok"] and not trace["errors"], trace["errors"]
        actions = assistant_turns(trace)
        assert actions and all(action.endswith("</move>") for action in actions)
        total, ended = replay(TICTACTOE, kwargs, trace["task"]["data"]["seed"], actions)
        assert ended, "the rollout stopped before the env ended the episode"
        assert trace["rewards"][REWARD]["score"] == pytest.approx(total)
        assert trace["metrics"]["env_turns"] == len(actions)
        assert trace["stop_condition"] == "env_done"


def _replay_game(game: str, kwargs: dict[str, Any], seed: int, actions: dict[str, list[str]]) -> dict[str, float]:
    """Each seat's payoff when the game is stepped directly with the seats' turns, each seat acting when asked."""
    from rl_llm.envs.social import load

    env = load(game).parallel_env(**kwargs)
    _, infos = env.reset(seed=seed)
    totals = {seat: 0.0 for seat in actions}
    while True:
        asked = {seat: actions[seat].pop(0) for seat in actions if infos[seat].get("active")}
        _, rewards, terminations, _, infos = env.step(asked)
        totals = {seat: totals[seat] + float(rewards[seat]) for seat in totals}
        if all(terminations.values()):
            assert not any(actions.values()), "a seat made moves after the game ended"
            return totals


def test_vf_eval_plays_a_two_player_game_with_both_seats_as_agents(tmp_path: Path) -> None:
    server = StreamingChatStub()
    try:
        traces = run_vf_eval(verifiers_python(), "social/prisoners_dilemma_v0", {"num_rounds": 3}, tmp_path,
                             server.url, "stub", num_tasks=1, rollouts=1, max_tokens=16)  # fmt: skip
    finally:
        server.close()
    by_seat = {trace["agent"]["name"]: trace for trace in traces}
    assert sorted(by_seat) == ["player_0", "player_1"]  # one episode, one trace per seat
    actions = {seat: assistant_turns(trace) for seat, trace in by_seat.items()}
    assert all(len(turns) == 3 for turns in actions.values())  # one move a round
    seed = by_seat["player_0"]["task"]["data"]["seed"]
    totals = _replay_game("prisoners_dilemma_v0", {"num_rounds": 3}, seed, actions)
    for seat, trace in by_seat.items():
        assert trace["rewards"][REWARD]["score"] == pytest.approx(totals[seat]) and totals[seat] > 0
        assert trace["stop_condition"] == "env_done"
