"""``reset(options={"task_index": i})`` takes any integer, NumPy's included, in every env that has the option,
under one rule and one message (the rule Terminal-v0 has)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rl_llm  # noqa: F401
from rl_llm.envs.registration import declared_reset_options

TASK_INDEX_ENVS = ["rl-llm/TextToSQL-v0", "rl-llm/Search-v0", "rl-llm/ToolCalls-v0"]


def test_these_are_the_envs_with_a_task_index_option() -> None:
    with_option = sorted(env_id for env_id in gym.registry if env_id.startswith("rl-llm/")
                         and "task_index" in (declared_reset_options(env_id) or ()))  # fmt: skip
    assert with_option == sorted([*TASK_INDEX_ENVS, "rl-llm/Terminal-v0"])


@pytest.mark.parametrize("env_id", TASK_INDEX_ENVS)
def test_numpy_integers_pick_the_same_task_as_ints(env_id: str) -> None:
    env = gym.make(env_id).unwrapped
    try:
        _, by_int = env.reset(seed=0, options={"task_index": 3})
        for index in (np.int64(3), np.int32(3), np.uint8(3)):
            _, info = env.reset(seed=0, options={"task_index": index})
            assert info["task_index"] == 3 and type(info["task_index"]) is int
            assert info["task_id"] == by_int["task_id"]
        # An index drawn with NumPy, as a curriculum or a sampler does.
        drawn = np.random.default_rng(0).integers(2)
        assert env.reset(options={"task_index": drawn})[1]["task_index"] == int(drawn)
    finally:
        env.close()


@pytest.mark.parametrize("env_id", TASK_INDEX_ENVS)
@pytest.mark.parametrize("index", [True, np.bool_(True), 3.0, np.float64(3.0), "3", -1, np.int64(-1), 10**9])
def test_bad_indices_get_the_same_error_everywhere(env_id: str, index: object) -> None:
    env = gym.make(env_id).unwrapped
    try:
        with pytest.raises(ValueError, match=r"^options\['task_index'\] must be an int in \[0, \d+\), got "):
            env.reset(seed=0, options={"task_index": index})
    finally:
        env.close()
