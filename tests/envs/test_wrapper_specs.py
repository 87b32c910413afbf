"""rl-llm's wrappers record their arguments, so ``gym.make(env.spec)`` rebuilds the whole stack, and it plays the
same episode for the same seed; and their ``render()`` follows Gymnasium's render modes."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

import rl_llm  # noqa: F401
from rl_llm.envs.wrappers import (
    ActionTemplate,
    MultiAttempt,
    OptimalCallsTracker,
    OptimalToolCalls,
    RecordTrajectories,
    TryAgain,
)

ENV_ID = "rl-llm/ToolCalls-v0"
# Turns that use a tool, give a wrong answer, an invalid turn, then more answers: enough to cross attempts.
TURNS = ["<calculate>6 * 7</calculate>", "<answer>-1</answer>", "no tags", "<answer>4-5</answer>",
         "<answer>0</answer>", "<answer>1</answer>"]  # fmt: skip


def _stacks(path: Path, tracker: OptimalCallsTracker) -> list[gym.Env]:
    return [
        RecordTrajectories(MultiAttempt(ActionTemplate(gym.make(ENV_ID), "<think>.</think>{}"), attempts=3,
                                        discount=0.9), path, extra={"run": "spec-test"}),
        TryAgain(OptimalToolCalls(gym.make(ENV_ID), variant="ppo", alpha=0.5, tracker=tracker), max_attempts=4,
                 gamma=0.25, feedback="No.", restate_task=False),
        OptimalToolCalls(TryAgain(gym.make(ENV_ID), max_attempts=2)),
    ]  # fmt: skip


def _play(env: gym.Env, seed: int) -> list[tuple]:
    observation, info = env.reset(seed=seed)
    steps: list[tuple] = [(observation, info["task_id"], info["system_prompt"])]
    for turn in TURNS:
        observation, reward, terminated, truncated, info = env.step(turn)
        steps.append((observation, reward, terminated, truncated, info["reward_components"], info["metrics"]))
        if terminated or truncated:
            break
    return steps


@pytest.mark.parametrize("stack", range(3))
def test_make_from_spec_rebuilds_the_stack_and_plays_the_same_episode(tmp_path: Path, stack: int) -> None:
    tracker = OptimalCallsTracker()
    env = _stacks(tmp_path / "episodes.jsonl", tracker)[stack]
    rebuilt = gym.make(env.spec)
    assert rebuilt.spec == env.spec and str(rebuilt) == str(env)
    for seed in (0, 7):
        assert _play(rebuilt, seed) == _play(env, seed)
    if stack == 0:  # both recorders append to the one file, the same episode twice
        first, second, *_ = (json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines())
        assert first == second and first["run"] == "spec-test"
    if stack == 1:  # a tracker is kept by reference, as Gymnasium keeps a callable: the rebuilt one pools into it
        assert rebuilt.env.tracker is tracker


def test_the_spec_survives_being_wrapped_again() -> None:
    # Gymnasium deep-copies the inner spec for each outer wrapper: a tracker's lock made that copy fail, and the
    # outer wrapper's spec came back None.
    env = ActionTemplate(OptimalToolCalls(gym.make(ENV_ID), tracker=OptimalCallsTracker()), "{}")
    assert [wrapper.name for wrapper in env.spec.additional_wrappers] == ["OptimalToolCalls", "ActionTemplate"]


# -- render modes ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("wrapper", [TryAgain, MultiAttempt])
def test_human_render_prints_each_step_and_returns_none(wrapper, capsys: pytest.CaptureFixture[str]) -> None:
    env = wrapper(gym.make(ENV_ID, render_mode="human"), max_attempts=3)
    env.reset(seed=0)
    feedback, *_ = env.step("<answer>-1</answer>")
    printed = capsys.readouterr().out
    assert feedback.splitlines()[0] in printed, "the feedback the agent got is shown as the step happens"
    assert env.render() is None and capsys.readouterr().out == ""


@pytest.mark.parametrize("wrapper", [TryAgain, MultiAttempt])
def test_ansi_render_returns_the_transcript_and_prints_nothing(wrapper, capsys: pytest.CaptureFixture[str]) -> None:
    env = wrapper(gym.make(ENV_ID, render_mode="ansi"), max_attempts=3)
    env.reset(seed=0)
    feedback, *_ = env.step("<answer>-1</answer>")
    text = env.render()
    assert isinstance(text, str) and feedback in text and capsys.readouterr().out == ""
