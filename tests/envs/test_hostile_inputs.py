"""Hostile or unusual inputs that once broke the environment contract (docs/design.md#the-environment-contract):
each gets a clear error or an invalid-action observation now, never a raw exception from deep inside."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

import rl_llm  # noqa: F401
from rl_llm.envs.math.answers import is_correct
from rl_llm.envs.parsing import parse_json_tool_calls
from rl_llm.envs.qa_scoring import numeric_or_exact_match
from rl_llm.envs.social import prisoners_dilemma_v0
from rl_llm.envs.social.base import AGENTS
from rl_llm.envs.terminal.terminal_env import TerminalEnv
from rl_llm.envs.wrappers import RecordTrajectories

BANDIT = "rl-llm/MultiArmedBandit-v0"
HUGE = "9" * 5000  # past int's 4,300-digit string limit, which json.loads hits with a plain ValueError

# -- JSON tool calls with an integer too long for int() ---------------------------------------------------------
HUGE_NUMBER_CALLS = [
    '<tool_call>{"name": "calculator", "arguments": {"expression": "1"}, "x": ' + HUGE + "}</tool_call>",
    '{"name": "calculator", "arguments": {"expression": "1"}, "x": ' + HUGE + "}",
    '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": ' + HUGE + '}"}</tool_call>',
]


@pytest.mark.parametrize("text", HUGE_NUMBER_CALLS)
def test_a_tool_call_with_a_huge_integer_is_a_malformed_call_not_a_crash(text: str) -> None:
    (call,) = parse_json_tool_calls(text)
    assert call.error is not None and "too many digits" in call.error


@pytest.mark.parametrize("text", HUGE_NUMBER_CALLS)
def test_tool_calls_env_answers_a_huge_integer_with_an_error_response(text: str) -> None:
    env = gym.make("rl-llm/ToolCalls-v0", tools=("search", "calculator"))
    env.reset(seed=0)
    observation, _, terminated, truncated, info = env.step(text)
    assert "too many digits" in observation and info["invalid_action"] and not (terminated or truncated)


# -- Terminal-v0: task_index beside task_family / difficulty -------------------------------------------------
@pytest.mark.parametrize("index", [-1, "abc", 1.7, True, 2**40])
def test_terminal_task_index_is_checked_beside_task_family(index: object) -> None:
    # Refused while the task is picked, before any sandbox is made.
    env = TerminalEnv()
    with pytest.raises(ValueError, match=r"options\['task_index'\] must be an int"):
        env.reset(seed=0, options={"task_family": "files", "task_index": index})
    env.close()


# -- reset options and social-game actions of the wrong type --------------------------------------------------
@pytest.mark.parametrize("options", ["task_index", ["means"], 3])
def test_reset_options_that_are_not_a_dict_are_refused_clearly(options: object) -> None:
    with pytest.raises(TypeError, match="reset options must be a dict"):
        gym.make(BANDIT).reset(seed=0, options=options)
    with pytest.raises(TypeError, match="reset options must be a dict"):
        prisoners_dilemma_v0.parallel_env().reset(seed=0, options=options)


@pytest.mark.parametrize(("actions", "error"), [
    (None, TypeError), (["<A>", "<A>"], TypeError), ("player_0 player_1", TypeError),
    ({AGENTS[0]: "<A>", AGENTS[1]: "<A>", "player_9": "<A>"}, ValueError),
])  # fmt: skip
def test_social_step_refuses_malformed_actions_and_changes_nothing(actions: object, error: type) -> None:
    env = prisoners_dilemma_v0.parallel_env(num_rounds=2)
    env.reset(seed=0)
    with pytest.raises(error, match="agent"):
        env.step(actions)
    assert env.round == 1 and env.agents == list(AGENTS)
    env.step({AGENTS[0]: "<A>", AGENTS[1]: "<B>"})  # the game goes on as if nothing happened
    assert env.round == 2


# -- characters stdout or UTF-8 cannot hold (a lone surrogate) -----------------------------------------------
def test_human_rendering_survives_a_lone_surrogate(capsys: pytest.CaptureFixture[str]) -> None:
    env = gym.make(BANDIT, render_mode="human")
    env.reset(seed=0)
    env.step("\ud800 <action>A</action>")
    game = prisoners_dilemma_v0.parallel_env(render_mode="human")
    game.reset(seed=0)
    game.step({AGENTS[0]: "\ud800 <A>", AGENTS[1]: "<B>"})
    game.render()
    assert "\\ud800 <action>A</action>" in capsys.readouterr().out


def test_record_trajectories_keeps_an_episode_with_a_lone_surrogate(tmp_path: Path) -> None:
    path = tmp_path / "episodes.jsonl"
    env = RecordTrajectories(gym.make(BANDIT, horizon=2), path)
    for action in ("\ud800 <action>A</action>", "é <action>B</action>"):
        env.reset(seed=0)
        while not any(env.step(action)[2:4]):
            pass
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [line["steps"][0]["action"] for line in lines] == ["\ud800 <action>A</action>", "é <action>B</action>"]


# -- answers whose sign or decimal point was dropped when graded ------------------------------------------------
@pytest.mark.parametrize("minus", ["\u2013", "\u2010", "\u207b", "\uff0d", "\u2212", "-"])
def test_math_reads_unicode_minus_signs_as_minus(minus: str) -> None:
    assert is_correct(f"{minus}4", "-4") and not is_correct(f"{minus}4", "4")


@pytest.mark.parametrize(("prediction", "gold"), [("-4", "4"), ("4", "-4"), ("4.5", "45"), ("10.0", "100")])
def test_numbers_compare_by_value_only(prediction: str, gold: str) -> None:
    # Exact match drops punctuation: "-4" and "4" normalise alike, so it must not decide between two numbers.
    assert numeric_or_exact_match(prediction, [gold]) == 0.0
    assert numeric_or_exact_match(gold, [gold, "a name"]) == 1.0
