"""Multi-armed and contextual bandit behaviour, and the classical baselines' theory-backed ordering."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rl_llm  # noqa: F401
from rl_llm.agents.baselines import make_baseline
from rl_llm.agents.baselines.bandits import bandit_statistics
from rl_llm.agents.evaluate import evaluate, summarize
from rl_llm.envs.bandits.base import parse_arm

MAB = "rl-llm/MultiArmedBandit-v0"
CB = "rl-llm/ContextualBandit-v0"


def pull_all(env: gym.Env, actions: list[str]) -> list[tuple]:
    return [env.step(action) for action in actions]


@pytest.mark.parametrize(
    ("text", "arm"),
    [("<action>B</action>", 1), ("<action> c </action>", 2), ("<action>Arm D</action>", 3),
     ("<action>A</action> on second thought <action>E</action>", 4), ("<action>F</action>", None),
     ("<action>AB</action>", None), ("<action>B", None), ("B", None)],
)
def test_parse_arm(text: str, arm: int | None) -> None:
    assert parse_arm(text, 5) == arm


def test_regret_is_zero_for_the_best_arm_and_linear_for_the_worst() -> None:
    means = [0.1, 0.9, 0.5, 0.3, 0.2]
    env = gym.make(MAB, means=means, horizon=10)
    env.reset(seed=0)
    *_, (_, _, terminated, _, info) = pull_all(env, ["<action>B</action>"] * 10)
    assert terminated and info["metrics"]["regret"] == pytest.approx(0.0)
    assert info["metrics"]["best_arm_share"] == 1.0
    env.reset(seed=0)
    *_, (_, _, _, _, info) = pull_all(env, ["<action>A</action>"] * 10)
    assert info["metrics"]["regret"] == pytest.approx(10 * 0.8)
    assert info["metrics"]["arms_untried_frac"] == pytest.approx(0.8)


def test_summary_observation_reports_pulls_and_means_exactly() -> None:
    env = gym.make(MAB, means=[0.0, 1.0, 0.0], num_arms=3, horizon=5)
    env.reset(seed=1)
    pull_all(env, ["<action>B</action>", "<action>B</action>"])
    observation, *_ = env.step("<action>A</action>")
    assert "Arm A gave reward 0." in observation
    counts, sums = bandit_statistics(observation)
    assert counts.tolist() == [1, 2, 0] and sums.tolist() == [0.0, 2.0, 0.0]
    assert "Pull 4 of 5" in observation


def test_full_history_observation_lists_every_pull_in_order() -> None:
    env = gym.make(MAB, means=[1.0, 0.0], num_arms=2, horizon=4, history="full")
    env.reset(seed=1)
    *_, (observation, *_rest) = pull_all(env, ["<action>A</action>", "<action>B</action>", "<action>A</action>"])
    assert "History (arm: reward): A: 1, B: 0, A: 1" in observation
    counts, sums = bandit_statistics(observation)
    assert counts.tolist() == [2, 1] and sums.tolist() == [2.0, 0.0]


def test_invalid_action_pulls_a_random_arm_with_penalty_and_still_counts_as_a_turn() -> None:
    env = gym.make(MAB, horizon=3, invalid_action_penalty=0.5, means=[0.0] * 5)
    env.reset(seed=4)
    observation, reward, terminated, truncated, info = env.step("I pick the blue one")
    assert info["invalid_action"] and not (terminated or truncated)
    assert info["reward_components"]["invalid_action"] == -0.5
    assert reward == pytest.approx(-0.5)  # all arms pay 0
    assert "Invalid action" in observation and "<action>A</action>" in observation
    assert info["metrics"]["invalid_actions"] == 1
    *_, (_, _, terminated, _, info) = pull_all(env, ["???", "???"])
    assert terminated and info["turn"] == 3


def test_strategic_reward_is_normalised_mean_of_the_chosen_arm() -> None:
    env = gym.make(MAB, means=[0.2, 0.6, 1.0], num_arms=3, reward_mode="strategic")
    env.reset(seed=0)
    rewards = [env.step(f"<action>{label}</action>")[1] for label in "ABC"]
    assert rewards == pytest.approx([0.0, 0.5, 1.0])


def test_algorithmic_reward_follows_ucb1_untried_arms_first() -> None:
    env = gym.make(MAB, means=[0.5] * 3, num_arms=3, reward_mode="algorithmic")
    env.reset(seed=0)
    # Every untried arm is a UCB1 choice, a repeated arm is not while others are untried.
    assert env.step("<action>A</action>")[1] == 1.0
    assert env.step("<action>A</action>")[1] == 0.0
    assert env.step("<action>B</action>")[1] == 1.0


def test_greedy_share_counts_choices_of_the_empirically_best_arm() -> None:
    env = gym.make(MAB, means=[1.0, 0.0, 0.0], num_arms=3, horizon=10)
    env.reset(seed=0)
    # A pays 1, B pays 0. The first pull has no empirical best; then B (untried) is not greedy, A is,
    # and C (untried) is not: 1 greedy choice out of 3.
    results = pull_all(env, ["<action>A</action>", "<action>B</action>", "<action>A</action>", "<action>C</action>"])
    assert [r[4]["metrics"]["greedy_share"] for r in results] == pytest.approx([0.0, 0.0, 0.5, 1 / 3])


def test_gap_instance_has_one_best_arm_at_the_right_place() -> None:
    env = gym.make(MAB, gap=0.2)
    positions = set()
    for seed in range(20):
        env.reset(seed=seed)
        means = env.unwrapped.means
        assert sorted(means.round(6).tolist()) == [0.4, 0.4, 0.4, 0.4, 0.6]
        positions.add(int(np.argmax(means)))
    assert len(positions) > 1, "the best arm should be permuted across seeds"


def test_gaussian_arms_pay_real_valued_rewards() -> None:
    env = gym.make(MAB, distribution="gaussian", sigma=1.0)
    _, info = env.reset(seed=0)
    assert "a real number" in info["system_prompt"]
    rewards = {env.step("<action>A</action>")[4]["sampled_reward"] for _ in range(5)}
    assert len(rewards) == 5 and not rewards <= {0.0, 1.0}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"num_arms": 1}, "num_arms"), ({"num_arms": 27}, "num_arms"), ({"horizon": 0}, "horizon"),
     ({"distribution": "poisson"}, "distribution"), ({"history": "none"}, "history"),
     ({"reward_mode": "x"}, "reward_mode"), ({"means": [0.5, 2.0, 0.1, 0.1, 0.1]}, r"\[0, 1\]"),
     ({"means": [0.5]}, "5 entries"), ({"distribution": "gaussian", "gap": 0.2}, "gap"),
     ({"distribution": "gaussian", "means": [0.0, float("nan"), 1.0, 2.0, 3.0]}, "finite")],
)
def test_bad_arguments_get_specific_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gym.make(MAB, **kwargs)


def test_contextual_regret_is_against_the_per_step_optimal_arm() -> None:
    env = gym.make(CB, horizon=20)
    env.reset(seed=5)
    inner = env.unwrapped
    best_arms = set()
    for _ in range(20):
        best = int(np.argmax(inner.theta @ inner.context))
        best_arms.add(best)
        *_, info = env.step(f"<action>{'ABCD'[best]}</action>")
    assert info["metrics"]["regret"] == pytest.approx(0.0)
    assert len(best_arms) > 1, "the optimal arm should change with the context"


def test_contextual_observation_shows_the_exact_context() -> None:
    env = gym.make(CB)
    observation, _ = env.reset(seed=2)
    shown = observation.split("Current context: [")[1].split("]")[0]
    assert np.allclose([float(v) for v in shown.split(",")], env.unwrapped.context)


def mean_regret(env_id: str, agent: str, episodes: int, **kwargs) -> tuple[float, float]:
    trajectories = evaluate(env_id, make_baseline(agent, env_id, seed=7), episodes, seed=100, env_kwargs=kwargs)
    return summarize(trajectories)["regret"]


def test_ucb_and_thompson_beat_random_and_epsilon_greedy_on_5_arm_bernoulli_at_t100() -> None:
    regret = {name: mean_regret(MAB, name, 200, horizon=100)
              for name in ("random", "epsilon_greedy", "ucb", "thompson")}
    for good in ("ucb", "thompson"):
        for bad in ("random", "epsilon_greedy"):
            (good_mean, good_half), (bad_mean, bad_half) = regret[good], regret[bad]
            # Separated 95% intervals, and by a margin of at least 2 pulls' worth of regret.
            assert good_mean + good_half < bad_mean - bad_half, (good, bad, regret)
            assert bad_mean - good_mean > 2.0, (good, bad, regret)


def test_linucb_has_far_lower_regret_than_random_on_the_contextual_bandit() -> None:
    linucb, _ = mean_regret(CB, "linucb", 40)
    random, _ = mean_regret(CB, "random", 40)
    assert linucb < 0.4 * random


@settings(max_examples=60, deadline=None)
@given(
    num_arms=st.integers(2, 6),
    distribution=st.sampled_from(["bernoulli", "gaussian"]),
    episodes=st.lists(st.lists(st.integers(-1, 6), min_size=1, max_size=12), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_summary_and_greedy_share_match_a_recount_of_the_episode_across_resets(
    num_arms: int, distribution: str, episodes: list[list[int]], seed: int
) -> None:
    """The env keeps each arm's summary line and empirical mean up to date pull by pull (cheaper than
    rebuilding them every step); recounted here from the pulls the env reports, with invalid turns (-1, or an
    arm past ``num_arms``) among them, over several episodes of one env, so nothing carries over a reset."""
    env = gym.make(MAB, num_arms=num_arms, distribution=distribution, horizon=12)
    labels = "ABCDEF"[:num_arms]
    for episode, choices in enumerate(episodes):
        observation, _ = env.reset(seed=seed + episode)
        assert all(f"{label}: 0 pulls" in observation for label in labels)
        counts, sums = [0] * num_arms, [0.0] * num_arms
        greedy = opportunities = 0
        for choice in choices:
            action = f"<action>{'ABCDEFG'[choice]}</action>" if choice >= 0 else "no tag"
            observation, _, terminated, _, info = env.step(action)
            arm = info["arm"]
            if not info["invalid_action"] and sum(counts):
                tried = [total / count for count, total in zip(counts, sums) if count]
                opportunities += 1
                greedy += bool(counts[arm]) and sums[arm] / counts[arm] >= max(tried) - 1e-12
            counts[arm] += 1
            sums[arm] += info["sampled_reward"]
            assert info["metrics"]["greedy_share"] == (greedy / opportunities if opportunities else 0.0)
            if terminated:
                break
            lines = [f"{label}: {count} {'pull' if count == 1 else 'pulls'}, mean reward {total / count:.3f}"
                     if count else f"{label}: 0 pulls" for label, count, total in zip(labels, counts, sums)]  # fmt: skip
            shown = observation.splitlines()
            first = next(i for i, line in enumerate(shown) if line.startswith("Pull ")) + 1
            assert shown[first : first + num_arms] == lines
