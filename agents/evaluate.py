"""Run a policy on an environment for N seeded episodes and summarise the results.

Episodes run as a batch: every live environment's conversation goes to the policy in one ``act`` call, so
batched backends generate for all of them at once. Episode ``i`` uses seed ``seed + i``, so two agents
evaluated with the same seed face the same tasks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rl_llm.agents.policy import Policy
from rl_llm.types import Message

# Two-sided 95% Student-t quantiles for 1..30 degrees of freedom; the normal 1.96 beyond.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)  # fmt: skip


def mean_ci95(values: Iterable[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (Student t)."""
    array = np.asarray(list(values), dtype=np.float64)
    if array.size == 0:
        return math.nan, math.nan
    if array.size == 1:
        return float(array[0]), math.nan
    df = array.size - 1
    quantile = _T95[df - 1] if df <= len(_T95) else 1.96
    return float(array.mean()), float(quantile * array.std(ddof=1) / math.sqrt(array.size))


@dataclass
class EpisodeRecord:
    episode: int
    seed: int
    task_id: str
    episode_return: float
    turns: int
    terminated: bool
    truncated: bool
    invalid_actions: int
    metrics: dict[str, float] = field(default_factory=dict)
    reward_components: dict[str, float] = field(default_factory=dict)
    transcript: str | None = None


def run_episodes(
    make_env: Callable[[], gym.Env],
    policy: Policy,
    episodes: int,
    seed: int = 0,
    batch_size: int = 16,
    keep_transcripts: bool = False,
    on_episode: Callable[[EpisodeRecord], None] | None = None,
) -> list[EpisodeRecord]:
    """Play ``episodes`` episodes, ``batch_size`` environments at a time, and return one record each."""
    envs = [make_env() for _ in range(min(batch_size, episodes))]
    records: list[EpisodeRecord] = []
    try:
        next_episode = 0
        live: dict[int, dict[str, Any]] = {}  # slot -> episode state

        def start(slot: int) -> None:
            nonlocal next_episode
            env = envs[slot]
            episode_seed = seed + next_episode
            observation, info = env.reset(seed=episode_seed)
            policy.start_episode(slot, env, info)
            live[slot] = {
                "episode": next_episode,
                "seed": episode_seed,
                "task_id": info["task_id"],
                "messages": [Message("system", info["system_prompt"]), Message("user", observation)],
                "return": 0.0,
                "invalid": 0,
                "components": {},
            }
            next_episode += 1

        for slot in range(len(envs)):
            start(slot)
        while live:
            slots = sorted(live)
            completions = policy.act([live[slot]["messages"] for slot in slots])
            for slot, completion in zip(slots, completions):
                state, env = live[slot], envs[slot]
                observation, reward, terminated, truncated, info = env.step(completion.text)
                state["messages"] += [Message("assistant", completion.text), Message("user", observation)]
                state["return"] += reward
                state["invalid"] += bool(info["invalid_action"])
                for name, value in info["reward_components"].items():
                    state["components"][name] = state["components"].get(name, 0.0) + value
                if not (terminated or truncated):
                    continue
                record = EpisodeRecord(
                    episode=state["episode"],
                    seed=state["seed"],
                    task_id=state["task_id"],
                    episode_return=state["return"],
                    turns=info["turn"],
                    terminated=terminated,
                    truncated=truncated,
                    invalid_actions=state["invalid"],
                    metrics=dict(info["metrics"]),
                    reward_components=state["components"],
                    transcript=env.unwrapped.transcript if keep_transcripts else None,
                )
                records.append(record)
                if on_episode is not None:
                    on_episode(record)
                del live[slot]
                if next_episode < episodes:
                    start(slot)
    finally:
        for env in envs:
            env.close()
    return sorted(records, key=lambda record: record.episode)


def summarize(records: list[EpisodeRecord]) -> dict[str, tuple[float, float]]:
    """Mean and 95% half-width of the return, the turns and every env metric."""
    summary = {"return": mean_ci95(r.episode_return for r in records), "turns": mean_ci95(r.turns for r in records)}
    summary["invalid_actions"] = mean_ci95(r.invalid_actions for r in records)
    for name in sorted({name for record in records for name in record.metrics}):
        summary[name] = mean_ci95(record.metrics.get(name, math.nan) for record in records)
    return summary


def write_jsonl(records: list[EpisodeRecord], path: str | Path, **extra: Any) -> Path:
    """One JSON object per episode (plus ``extra`` fields such as env id and agent name)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps({**extra, **asdict(record)}, ensure_ascii=False) + "\n")
    return path
