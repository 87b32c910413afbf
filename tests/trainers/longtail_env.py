"""A test environment with long-tailed episode lengths, for partial rollouts (``tests.trainers.longtail_env:LongTail-v0``).

Seeds divisible by 3 give 6-turn episodes, the others 1 turn; every turn is valid and the final reward is the
number of characters written (capped), so the tiny model gets a signal whatever it writes. Importing the
module registers the id, so a training subprocess can name it in ``env.id``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rl_llm.envs.spaces import UnicodeText


class LongTailEnv(gym.Env):
    def __init__(self) -> None:
        self.observation_space = UnicodeText(10_000)
        self.action_space = UnicodeText(10_000)
        self.turns_left = 0
        self.written = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.turns_left = 6 if (seed or 0) % 3 == 0 else 1
        self.written = 0
        info = {"system_prompt": "Write something.", "task_id": f"longtail-{seed}", "stop": []}
        return f"Turns: {self.turns_left}", info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.turns_left -= 1
        self.written += len(action)
        done = self.turns_left <= 0
        reward = min(self.written, 8) / 8 if done else 0.0
        info = {"reward_components": {"length": reward}, "invalid_action": False, "metrics": {"written": self.written}}
        return ("" if done else "Again."), reward, done, False, info


if "tests/LongTail-v0" not in gym.registry:
    gym.register("tests/LongTail-v0", entry_point=LongTailEnv, order_enforce=False, disable_env_checker=True)
