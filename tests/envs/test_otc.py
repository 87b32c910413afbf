"""OTC-PPO / OTC-GRPO against hand-computed values, and the OptimalToolCalls wrapper on Search-v0."""

from __future__ import annotations

import itertools
import math

import gymnasium as gym
import pytest

import rl_llm  # noqa: F401
from rl_llm.envs.wrappers.otc import (
    OptimalCallsTracker,
    OptimalToolCalls,
    otc_grpo_tool_reward,
    otc_mapping,
    otc_ppo_tool_reward,
    tool_productivity,
)


@pytest.mark.parametrize(
    ("calls", "c", "expected"),
    [(0, 1.0, 1.0), (1, 1.0, 0.5), (2, 1.0, math.cos(2 * math.pi / 5)), (3, 1.0, math.cos(3 * math.pi / 7)),
     (1, 2.0, math.cos(math.pi / 4)), (2, 4.0, math.cos(math.pi / 4))],
)  # fmt: skip
def test_otc_ppo_matches_hand_computed_values(calls, c, expected) -> None:
    assert otc_ppo_tool_reward(calls, c) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("calls", "optimal", "mapped", "expected"),
    [(0, 0, 0.0, 1.0), (1, 0, 1.0, 0.5), (2, 2, 2.0, 1.0), (1, 2, 4 / 3, math.sin(math.pi / 3)),
     (3, 2, 12 / 5, math.sin(0.6 * math.pi)), (4, 2, 8 / 3, math.sin(2 * math.pi / 3)), (0, 2, 0.0, 0.0),
     (3, 3, 3.0, 1.0), (6, 3, 4.0, math.sin(2 * math.pi / 3))],
)  # fmt: skip
def test_otc_grpo_matches_hand_computed_values(calls, optimal, mapped, expected) -> None:
    assert otc_mapping(calls, optimal) == pytest.approx(mapped)
    assert otc_grpo_tool_reward(calls, optimal, c=1.0) == pytest.approx(expected)


def test_fewer_calls_rank_strictly_higher() -> None:
    ppo = [otc_ppo_tool_reward(m, c=1.0) for m in range(12)]
    assert all(a > b for a, b in itertools.pairwise(ppo))
    for n in (1, 2, 3):
        grpo = [otc_grpo_tool_reward(m, n) for m in range(n, n + 12)]
        assert grpo[0] == pytest.approx(1.0) and all(a > b for a, b in itertools.pairwise(grpo))
        assert all(otc_grpo_tool_reward(m, n) < 1.0 for m in range(n))  # too few calls is not optimal either


def test_invalid_otc_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        otc_ppo_tool_reward(1, c=0)
    with pytest.raises(ValueError, match=">= 0"):
        otc_grpo_tool_reward(-1, 2)
    with pytest.raises(ValueError, match="'grpo' or 'ppo'"):
        OptimalToolCalls(gym.make("rl-llm/Search-v0"), variant="dpo")


def _episode(env: gym.Env, extra_searches: int, correct: bool, seed: int = 4) -> tuple[float, dict]:
    """The oracle's searches plus ``extra_searches`` more, then a right or wrong answer."""
    env.reset(seed=seed)
    task = env.unwrapped.current_task
    total = 0.0
    for query in [*task.oracle_queries, *["filler query"] * extra_searches]:
        total += env.step(f"<search>{query}</search>")[1]
    _, reward, terminated, _, info = env.step(f"<answer>{task.answers[0] if correct else 'nobody'}</answer>")
    assert terminated
    return total + reward, info


@pytest.mark.parametrize("variant", ["ppo", "grpo"])
def test_wrapper_ranks_fewer_calls_higher_and_gives_wrong_answers_zero(variant) -> None:
    env = OptimalToolCalls(gym.make("rl-llm/Search-v0", max_turns=10), variant=variant, tracker=OptimalCallsTracker())
    returns = [_episode(env, extra, correct=True)[0] for extra in range(4)]
    assert all(a > b for a, b in itertools.pairwise(returns)), returns
    n = env.unwrapped.current_task.optimal_tool_calls
    expected = otc_ppo_tool_reward(n) if variant == "ppo" else 1.0
    assert returns[0] == pytest.approx(expected)
    assert [_episode(env, extra, correct=False)[0] for extra in range(4)] == [0.0] * 4


def test_wrapper_components_sum_to_the_reward_and_metrics_say_why() -> None:
    env = OptimalToolCalls(gym.make("rl-llm/Search-v0", max_turns=10), variant="grpo", alpha=2.0,
                           tracker=OptimalCallsTracker())  # fmt: skip
    total, info = _episode(env, extra_searches=2, correct=True)
    n = env.unwrapped.current_task.optimal_tool_calls
    assert total == pytest.approx(2.0 * otc_grpo_tool_reward(n + 2, n))
    assert sum(info["reward_components"].values()) == pytest.approx(total)
    assert info["reward_components"]["em"] == 1.0
    assert info["metrics"]["otc_optimal_calls"] == n and info["metrics"]["otc_r_tool"] == pytest.approx(total / 2)


def test_running_minimum_over_correct_rollouts_when_the_task_count_is_not_used() -> None:
    tracker = OptimalCallsTracker()
    env = OptimalToolCalls(gym.make("rl-llm/Search-v0", max_turns=10), tracker=tracker, use_task_optimum=False)
    first, _ = _episode(env, extra_searches=2, correct=True)  # the first correct rollout sets n = its calls
    assert first == pytest.approx(1.0)
    n = env.unwrapped.current_task.optimal_tool_calls
    wrong, _ = _episode(env, extra_searches=0, correct=False)  # wrong rollouts do not move n
    assert wrong == 0.0 and tracker.fewest(env.unwrapped.current_task.id) == n + 2
    assert _episode(env, extra_searches=0, correct=True)[0] == pytest.approx(1.0)  # fewer calls: new n
    again, info = _episode(env, extra_searches=2, correct=True)
    assert again == pytest.approx(otc_grpo_tool_reward(n + 2, n)) and info["metrics"]["otc_optimal_calls"] == n
    assert tracker.episodes == 4 and tracker.correct == 3
    assert tracker.tool_productivity == pytest.approx(3 / ((n + 2) + n + n + (n + 2)))


def test_tool_productivity_is_correct_answers_per_call() -> None:
    assert tool_productivity([{"correct": 1, "tool_calls": 2}, {"correct": 0, "tool_calls": 3}]) == pytest.approx(0.2)
    assert tool_productivity([{"correct": 0, "tool_calls": 0}]) == 0.0
    assert tool_productivity([{"correct": 1, "tool_calls": 0}]) == math.inf


def test_wrapper_needs_a_tool_call_count() -> None:
    env = OptimalToolCalls(gym.make("rl-llm/TicTacToe-v0"), tracker=OptimalCallsTracker())
    env.reset(seed=0)
    with pytest.raises(KeyError, match="tool_calls"):
        for cell in ("A1", "A2", "A3", "B1", "B2", "B3", "C1", "C2", "C3") * 3:
            env.step(f"<move>{cell}</move>")
