"""Contract tests run against every registered environment (DESIGN.md section 2).

A newly registered environment is covered automatically. Environments that need arguments to run
quickly in tests list them in ``TEST_KWARGS``.
"""

from __future__ import annotations

import math

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given
from hypothesis import strategies as st

import rl_llm  # noqa: F401
from rl_llm.agents.baselines import baselines_for, make_baseline
from rl_llm.agents.evaluate import run_episodes
from rl_llm.envs.math.problems import reasoning_gym_import_error
from rl_llm.envs.registration import env_ids
from tests.conftest import hostile_text

TEST_KWARGS: dict[str, dict] = {
    # Short episodes and commands keep the fuzz (one sandbox per example) quick; level 1 fits the oracle in 6 turns.
    "rl-llm/Terminal-v0": {"max_turns": 6, "command_timeout_s": 5.0, "difficulty": 1},
}
STEP_INFO_KEYS = {"reward_components", "invalid_action", "metrics"}
RESET_INFO_KEYS = {"system_prompt", "task_id", "stop"}


def make(env_id: str) -> gym.Env:
    if env_id == "rl-llm/Math-v0" and (missing := reasoning_gym_import_error()) is not None:
        pytest.skip(f"needs {missing}")
    return gym.make(env_id, **TEST_KWARGS.get(env_id, {}))


ALL_ENVS = pytest.mark.parametrize("env_id", env_ids())


@ALL_ENVS
def test_check_env_passes(env_id: str) -> None:
    env = make(env_id)
    check_env(env.unwrapped, skip_render_check=False)
    env.close()


@ALL_ENVS
def test_reset_info_has_contract_keys(env_id: str) -> None:
    env = make(env_id)
    observation, info = env.reset(seed=3)
    assert info.keys() >= RESET_INFO_KEYS
    assert isinstance(info["system_prompt"], str) and info["system_prompt"]
    assert isinstance(info["task_id"], str) and info["task_id"]
    assert all(isinstance(stop, str) for stop in info["stop"])
    assert isinstance(observation, str) and observation
    assert env.reset(seed=3)[1]["task_id"] == info["task_id"]
    env.close()


@ALL_ENVS
@given(actions=st.lists(hostile_text(), min_size=1, max_size=8), seed=st.integers(0, 2**16))
def test_survives_arbitrary_text_for_whole_episodes(env_id: str, actions: list[str], seed: int) -> None:
    env = make(env_id)
    env.reset(seed=seed)
    limit = env.unwrapped.max_turns
    for turn in range(1, limit + 1):
        observation, reward, terminated, truncated, info = env.step(actions[turn % len(actions)])
        assert isinstance(observation, str)
        assert math.isfinite(reward)
        assert info.keys() >= STEP_INFO_KEYS
        assert math.isclose(reward, sum(info["reward_components"].values()), abs_tol=1e-9)
        if terminated or truncated:
            assert observation == ""
            break
    else:
        pytest.fail(f"episode did not end within max_turns={limit}")
    assert turn <= limit
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("after the end")
    env.close()


def _play(env_id: str, seed: int) -> tuple[list[str], list[float]]:
    """Transcripts and returns of 3 episodes with the env's first baseline (or fixed texts)."""
    names = baselines_for(env_id)
    if names:
        policy = make_baseline(names[0], env_id, seed=seed)
        records = run_episodes(lambda: make(env_id), policy, episodes=3, seed=seed, keep_transcripts=True)
        return [r.transcript for r in records], [r.episode_return for r in records]
    env = make(env_id)
    env.reset(seed=seed)
    rewards, done = [], False
    while not done:
        _, reward, terminated, truncated, _ = env.step("<answer>42</answer>")
        rewards.append(reward)
        done = terminated or truncated
    return [env.unwrapped.transcript], rewards


@ALL_ENVS
def test_same_seed_gives_identical_transcripts_and_rewards(env_id: str) -> None:
    first, second = _play(env_id, seed=11), _play(env_id, seed=11)
    assert first == second
    other = _play(env_id, seed=12)
    assert other[0] != first[0], "different seeds should give different episodes"


@ALL_ENVS
def test_step_rejects_non_text_actions(env_id: str) -> None:
    env = make(env_id)
    env.reset(seed=0)
    with pytest.raises(TypeError, match="as str"):
        env.unwrapped.step(123)
    env.close()
