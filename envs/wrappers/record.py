"""``RecordTrajectories``: append every finished episode of any rl-llm env to a JSONL file.

One line per episode: the task, the system prompt, each (action, observation, reward, reward components,
invalid flag, metrics) step, and the episode's return. Enough to replay an episode (same seed and options,
same actions) or to inspect what an agent did, without a rollout engine.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, ClassVar, SupportsFloat

import gymnasium as gym


class RecordTrajectories(gym.Wrapper[str, str, str, str], gym.utils.RecordConstructorArgs):
    """Write each finished episode as one JSON line to ``path`` (appending; thread-safe per file).

    Its arguments are recorded (``gymnasium.utils.RecordConstructorArgs``), so ``gym.make(env.spec)`` rebuilds
    it; the rebuilt wrapper appends to the same file."""

    # One lock per file across wrappers, so concurrent envs writing the same file never interleave lines.
    _locks: ClassVar[dict[Path, threading.Lock]] = {}

    def __init__(self, env: gym.Env, path: str | Path, *, extra: dict[str, Any] | None = None) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, path=path, extra=extra)
        gym.Wrapper.__init__(self, env)
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.extra = dict(extra or {})
        self._lock = self._locks.setdefault(self.path.resolve(), threading.Lock())
        self._episode: dict[str, Any] | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        observation, info = self.env.reset(seed=seed, options=options)
        self._episode = {
            **self.extra,
            "env_id": self.env.spec.id if self.env.spec else type(self.env.unwrapped).__name__,
            "seed": seed,
            "options": options or {},
            "task_id": info.get("task_id"),
            "system_prompt": info.get("system_prompt"),
            "first_observation": observation,
            "steps": [],
        }
        return observation, info

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        if self._episode is not None:
            self._episode["steps"].append({
                "action": action,
                "observation": observation,
                "reward": float(reward),
                "reward_components": info.get("reward_components", {}),
                "invalid_action": bool(info.get("invalid_action", False)),
                "metrics": info.get("metrics", {}),
            })
            if terminated or truncated:
                self._finish(terminated, truncated)
        return observation, reward, terminated, truncated, info

    def _finish(self, terminated: bool, truncated: bool) -> None:
        episode, self._episode = self._episode, None
        episode.update(terminated=terminated, truncated=truncated,
                       episode_return=sum(step["reward"] for step in episode["steps"]))
        try:
            line = (json.dumps(episode, ensure_ascii=False, default=str) + "\n").encode("utf-8")
        except UnicodeEncodeError:
            # A lone surrogate (an action may hold any str) has no UTF-8 form: this line escapes every non-ASCII
            # character instead (JSON escapes such as \ud800, which json.loads reads back to the same text).
            # Writing it raw raised from step() and lost the episode.
            line = (json.dumps(episode, default=str) + "\n").encode("ascii")
        with self._lock, self.path.open("ab") as handle:
            handle.write(line)
