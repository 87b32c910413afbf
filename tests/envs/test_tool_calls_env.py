"""ToolCalls-v0: oracles (XML and JSON calls) solve every task, malformed calls get corrective responses,
and python code stays inside the sandbox."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import rl_llm  # noqa: F401
from rl_llm.agents.baselines.search import ToolCallsJsonOracle, ToolCallsOracle
from tests.envs.helpers_search import play_task

NO_PYTHON = ("search", "calculator")


@pytest.mark.parametrize("oracle", [ToolCallsOracle, ToolCallsJsonOracle])
def test_oracles_solve_every_task_with_exactly_the_reference_calls(oracle) -> None:
    env = gym.make("rl-llm/ToolCalls-v0", tools=NO_PYTHON)
    assert not any(task.kind in ("digit_sum", "prime_count") for task in env.unwrapped.tasks)
    for index, task in enumerate(env.unwrapped.tasks):
        result = play_task(env, oracle(), index)
        assert result["metrics"]["correct"] == 1.0 and result["return"] == 1.0, task.question
        assert result["metrics"]["tool_calls"] == task.optimal_tool_calls
        assert result["metrics"]["invalid_tool_calls"] == 0


def test_system_prompt_declares_the_tools_as_json_schemas() -> None:
    env = gym.make("rl-llm/ToolCalls-v0", tools=NO_PYTHON)
    _, info = env.reset(seed=0)
    schemas = json.loads(info["system_prompt"].split("JSON schemas:\n", 1)[1].split("\nCall a tool", 1)[0])
    assert [s["function"]["name"] for s in schemas] == ["search", "calculator"] == [t["function"]["name"] for t in info["tools"]]
    assert schemas[0]["function"]["parameters"]["required"] == ["query"]
    assert "<answer>" in info["system_prompt"] and info["optimal_tool_calls"] >= 1


@pytest.fixture
def env():
    env = gym.make("rl-llm/ToolCalls-v0", tools=NO_PYTHON, max_turns=20)
    env.reset(seed=0)
    return env


@pytest.mark.parametrize(
    ("action", "expected"),
    [('<tool_call>{"name": "search", "arguments": {"query": "x"}</tool_call>', "Error: tool call is not valid JSON"),
     ('<tool_call>{"name": "browser", "arguments": {"url": "x"}}</tool_call>',
      "Error: the tool 'browser' does not exist; the tools are: search, calculator."),
     ('<tool_call>{"name": "calculator", "arguments": {"expression": 42}}</tool_call>',
      "Error: the argument 'expression' of 'calculator' must be a string, got integer."),
     ('<tool_call>{"name": "search", "arguments": {}}</tool_call>', "Error: 'search' needs the argument 'query' (string)."),
     ('<tool_call>{"name": "search", "arguments": {"query": "a", "k": 3}}</tool_call>',
      "Error: 'search' has no argument 'k'; its arguments are: query."),
     ('<tool_call>{"name": "search", "arguments": ["a"]}</tool_call>', "Error: 'arguments' must be a JSON object"),
     ('<tool_call>[1, 2]</tool_call>', "Error: tool call must be a JSON object"),
     ("<search>who founded it", "Error: the <search> tag was not closed with </search>."),
     ("<python>print(1)</python>", "Error: the tool 'python' is not available in this environment"),
     ("I am thinking about it.", "Error: no tool call or answer found."),
     ("<answer>42", "Error: the <answer> tag was not closed with </answer>.")],
)  # fmt: skip
def test_malformed_tool_calls_get_a_clear_corrective_observation(env, action, expected) -> None:
    observation, reward, terminated, _, info = env.step(action)
    assert expected in observation
    assert info["invalid_action"] and not terminated and reward == 0.0
    assert info["metrics"]["tool_calls"] == 0


def test_fifty_tool_calls_in_one_turn_run_none_and_say_the_limit(env) -> None:
    observation, _, terminated, _, info = env.step("<calculator>1 + 1</calculator>" * 50)
    assert observation.startswith("Error: 50 tool calls in one turn; the limit is 4. None were run")
    assert info["invalid_action"] and not terminated and info["metrics"]["tool_calls"] == 0
    assert info["metrics"]["invalid_tool_calls"] == 50
    observation, *_ = env.step("<calculator>1 + 1</calculator>" * 100)  # past the scan limit: "64+"
    assert "64+ tool calls" in observation


def test_valid_calls_run_beside_invalid_ones_in_order(env) -> None:
    action = ('<calculator>6 * 7</calculator> {"name": "x"} <tool_call>{"name": "calculator", "arguments": '
              '"{\\"expression\\": \\"2 ** 5\\"}"}</tool_call><calculator>1/0</calculator>')  # fmt: skip
    observation, _, _, _, info = env.step(action)
    responses = observation.split("</tool_response>")
    assert "\n42\n" in responses[0] and "\n32\n" in responses[1] and "division by zero" in responses[2]
    assert info["metrics"]["calculator_calls"] == 3 and not info["invalid_action"]  # a tool error is not a bad call


def test_bare_json_calls_and_answers(env) -> None:
    observation, *_ = env.step('{"name": "calculator", "arguments": {"expression": "2 + 2"}}')
    assert observation == '<tool_response name="calculator">\n4\n</tool_response>'
    task = env.unwrapped.current_task
    _, reward, terminated, _, info = env.step(f"<answer> {task.answers[0]} </answer>")
    assert terminated and reward == 1.0 and info["metrics"]["answered"] == 1.0


def test_an_answer_after_tool_calls_in_the_same_turn_is_ignored(env) -> None:
    observation, _, terminated, _, _ = env.step("<calculator>3 + 4</calculator><answer>7</answer>")
    assert not terminated and "\n7\n" in observation and "the answer in this turn was ignored" in observation


def test_tags_inside_a_tool_body_are_not_actions() -> None:
    env = gym.make("rl-llm/ToolCalls-v0", tools=("calculator",))
    env.reset(seed=0)
    _, _, terminated, _, _ = env.step("<calculator>1 + 1 <answer>5</answer></calculator>")
    assert not terminated


def test_search_results_and_wrong_answers() -> None:
    env = gym.make("rl-llm/ToolCalls-v0", tools=NO_PYTHON, kinds=("lookup",))
    env.reset(seed=3)
    task = env.unwrapped.current_task
    observation, *_ = env.step(f"<search>{task.calls[0].arguments['query']}</search>")
    assert observation.startswith('<tool_response name="search">\nDoc 1(Title: ') and task.answers[0] in observation.replace(",", "")
    _, reward, terminated, _, info = env.step("<answer>12</answer>")
    assert terminated and reward == 0.0 and info["metrics"]["correct"] == 0.0


def test_arguments_are_checked() -> None:
    for kwargs, message in [({"tools": ("search", "shell")}, "subset"), ({"tools": ()}, "non-empty"),
                            ({"kinds": ("poetry",)}, "unknown task kinds"), ({"max_calls_per_turn": 0}, ">= 1"),
                            ({"tools": ("calculator",), "kinds": ("lookup",)}, "no task can be solved")]:
        with pytest.raises(ValueError, match=message):
            gym.make("rl-llm/ToolCalls-v0", **kwargs)  # fmt: skip
