"""Baselines given observations their environment would never send: an action, or a ValueError saying what is
missing (the rollout engine records it as the episode's error), never a TypeError from inside the parser."""

from __future__ import annotations

import gymnasium as gym
import pytest

import rl_llm  # noqa: F401  (registers the environments)
from rl_llm.agents.baselines import BASELINES
from rl_llm.agents.policy import EpisodeStart
from rl_llm.types import Message

# Terminal-v0 needs a sandbox and Math-v0 an optional extra: their baselines are fuzzed with their env tests.
ENV_IDS = [env_id for env_id in BASELINES if env_id.startswith("rl-llm/") and env_id not in
           ("rl-llm/Terminal-v0", "rl-llm/Math-v0")]  # fmt: skip
ODD = ["", "\x00\ud7ff tag <move><sql>", "Current context: [0.5, -1.0]", "<move>" * 2000, "a" * 200_000]


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_baselines_answer_odd_observations_or_say_what_is_missing(env_id: str) -> None:
    env = gym.make(env_id)
    try:
        _, info = env.reset(seed=0)
        for name, factory in BASELINES[env_id].items():
            agent = factory(seed=0).start_episode(EpisodeStart(env, info, seed=0))
            for observation in ODD:
                conversation = [Message("system", info["system_prompt"]), Message("user", observation)]
                try:
                    action = agent.act(conversation)
                except ValueError:
                    continue
                assert isinstance(getattr(action, "text", action), str), (name, observation[:20])
    finally:
        env.close()
