"""Playing episodes of an environment with a policy (used by the search, tool-call and terminal tests)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rl_llm.agents.policy import EpisodeStart, Policy, as_completion
from rl_llm.types import Message


def play(env: gym.Env, policy: Policy, seed: int, options: dict[str, Any] | None = None) -> tuple[float, dict[str, Any]]:
    """One episode of ``policy``: (return, the final step's info plus ``terminated``)."""
    observation, info = env.reset(seed=seed, options=options)
    agent = policy.start_episode(EpisodeStart(env, info, seed=seed))
    messages = [Message("system", info["system_prompt"]), Message("user", observation)]
    total, done = 0.0, False
    while not done:
        action = as_completion(agent.act(messages)).text
        observation, reward, terminated, truncated, info = env.step(action)
        messages += [Message("assistant", action), Message("user", observation)]
        total += reward
        done = terminated or truncated
    return total, {**info, "terminated": terminated}


def play_task(env: gym.Env, policy: Policy, index: int) -> dict[str, Any]:
    """One episode on task ``index``; returns the final step's info plus the return and ``terminated``."""
    total, info = play(env, policy, index, {"task_index": index})
    return {**info, "return": total}
