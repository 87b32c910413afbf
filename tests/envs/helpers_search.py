"""Playing every task of an environment with a policy (used by the search and tool-call tests)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rl_llm.agents.policy import Policy
from rl_llm.types import Message


def play_task(env: gym.Env, policy: Policy, index: int) -> dict[str, Any]:
    """One episode on task ``index``; returns the final step's info plus the return and the turn count."""
    observation, info = env.reset(seed=index, options={"task_index": index})
    policy.start_episode(0, env, info)
    messages = [Message("system", info["system_prompt"]), Message("user", observation)]
    total, done = 0.0, False
    while not done:
        action = policy.act([messages])[0].text
        observation, reward, terminated, truncated, step_info = env.step(action)
        messages += [Message("assistant", action), Message("user", observation)]
        total += reward
        done = terminated or truncated
    return {**step_info, "return": total, "terminated": terminated}
