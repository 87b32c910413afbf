"""Held-out evaluation of the policy being trained, and of the env's classical baselines on the same seeds."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import gymnasium as gym
from rich.console import Console

from rl_llm.agents.baselines import baselines_for, make_baseline
from rl_llm.agents.evaluate import evaluate, mean_ci95, summary_table
from rl_llm.agents.rollout import collect
from rl_llm.trainers.checkpoint import write_text_atomic
from rl_llm.trainers.generation import play_whole

if TYPE_CHECKING:
    from rl_llm.agents.llm import LLMPolicy
    from rl_llm.trainers.config import TrainConfig
    from rl_llm.types import Trajectory

# Env metrics worth a column in the before/after table, when present.
TABLE_METRICS = ("regret", "invalid_actions", "win", "draw", "loss", "illegal_moves", "exec_match")


@dataclass
class EvalResult:
    """Per-episode figures by name (``return`` plus the env's final metrics), in seed order."""

    seeds: list[int]
    values: dict[str, list[float]] = field(default_factory=dict)

    def mean(self, name: str) -> float:
        return mean_ci95(self.values.get(name, []))[0]

    def ci95(self, name: str) -> tuple[float, float]:
        return mean_ci95(self.values.get(name, []))

    def means(self) -> dict[str, float]:
        return {name: self.mean(name) for name in self.values}

    def save(self, path: Path) -> None:
        write_text_atomic(path, json.dumps({"seeds": self.seeds, "values": self.values}))

    @classmethod
    def load(cls, path: Path) -> EvalResult:
        record = json.loads(path.read_text(encoding="utf-8"))
        return cls(seeds=list(record["seeds"]), values={k: list(v) for k, v in record["values"].items()})


def _result(seeds: Sequence[int], returns: Sequence[float], metrics: Sequence[dict[str, float]]) -> EvalResult:
    values: dict[str, list[float]] = {"return": [float(r) for r in returns]}
    for name in sorted({name for m in metrics for name in m}):
        values[name] = [float(m.get(name, math.nan)) for m in metrics]
    return EvalResult(seeds=list(seeds), values=values)


def evaluate_llm(make_env: Callable[[], gym.Env], policy: LLMPolicy, seeds: Sequence[int], temperature: float,
                 max_new_tokens: int, concurrency: int,
                 recover: Callable[[Sequence[Trajectory]], bool] | None = None) -> EvalResult:  # fmt: skip
    """One episode per seed with ``policy`` sampling at ``temperature`` (0 = greedy); weights untouched.
    ``recover`` (the run's ``Generation.recover``) True after a rollout: the generator was lost and restarted,
    so every episode is played again (a lost episode is not the policy's result)."""
    training_sampling = policy.sampling
    policy.sampling = replace(training_sampling, temperature=temperature)
    try:
        play = functools.partial(collect, make_env, policy, list(seeds), 1, max_new_tokens=max_new_tokens,
                                 concurrency=concurrency)  # fmt: skip
        trajectories = play_whole(play, recover)
    finally:
        policy.sampling = training_sampling
    return _result(seeds, [t.total_reward for t in trajectories], [t.metrics for t in trajectories])


def evaluate_baselines(config: TrainConfig, names: Sequence[str]) -> dict[str, EvalResult]:
    """The env's named baselines (those defined for it) on the held-out seeds, on the raw env."""
    env_id, episodes, seed = config.env.id, config.eval.episodes, config.eval.seed
    available = baselines_for(env_id)
    results = {}
    for name in names:
        if name not in available:
            continue
        trajectories = evaluate(env_id, make_baseline(name, env_id, seed=seed), episodes, seed=seed,
                                env_kwargs=config.env.kwargs)  # fmt: skip
        results[name] = _result([int(t.seed) for t in trajectories], [t.total_reward for t in trajectories],
                                [t.metrics for t in trajectories])  # fmt: skip
    return results


def print_comparison(title: str, rows: dict[str, EvalResult], console: Console | None = None,
                     columns: Sequence[str] | None = None) -> None:
    """Mean ± 95% half-width of the return and the main env metrics (or ``columns``), one row per agent."""
    if columns is None:
        columns = ["return"] + [m for m in TABLE_METRICS if all(m in r.values for r in rows.values())]
    summaries = {agent: {column: result.ci95(column) for column in columns} for agent, result in rows.items()}
    (console or Console()).print(summary_table(title, summaries, columns))
