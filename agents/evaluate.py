"""Run any agent on an environment for N seeded episodes and summarise the results.

``evaluate`` is the one entry point (``rl-llm eval`` uses it): every agent, LLM or baseline, plays through the
rollout engine (concurrent; token-in token-out for LLMs) and every episode is a ``Trajectory``
(``trajectories_out`` keeps them as JSONL for ``rl-llm view``). Episode ``i`` uses seed ``seed + i``, so two
agents evaluated with the same seed face the same tasks; an episode that fails (an env error) is recorded
with its ``error`` and the others go on. ``summarize`` gives means with 95% intervals, ``write_jsonl`` one
summary line per episode (``episode_row``), ``plot_records`` a PNG of the return distribution and the env
metrics.

``run_episodes`` and ``EpisodeRecord`` (the old lock-step loop for baselines and its record) are deprecated:
``run_episodes`` now plays through the engine too and converts its trajectories.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from rich.table import Table

from rl_llm.agents.policy import Policy
from rl_llm.checks import integer
from rl_llm.types import Trajectory

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


def evaluate(
    env: str | Callable[[], gym.Env],
    policy: Policy,
    episodes: int,
    *,
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
    batch_size: int = 16,
    on_episode: Callable[[Trajectory], None] | None = None,
    trajectories_out: str | Path | None = None,
    **engine_options: Any,
) -> list[Trajectory]:
    """Play ``episodes`` seeded episodes (seeds ``seed .. seed + episodes - 1``) with any agent, ``batch_size``
    at a time; one ``Trajectory`` per episode, in seed order. ``env``: an env id or a zero-argument factory.
    ``engine_options`` go to the rollout engine (``max_new_tokens``, ``tokenizer``, ...)."""
    from rl_llm.agents.rollout import collect, write_trajectories

    # Named here: a float count or seed failed inside range(), a negative seed in every env.reset, and
    # batch_size would be reported as the engine's concurrency.
    episodes, seed = integer("episodes", episodes), integer("seed", seed)
    batch_size = integer("batch_size", batch_size, minimum=1)
    trajectories = collect(env, policy, list(range(seed, seed + episodes)), env_kwargs=env_kwargs,
                           concurrency=batch_size, on_trajectory=on_episode, **engine_options)  # fmt: skip
    if trajectories_out is not None:
        write_trajectories(trajectories, trajectories_out)
    return trajectories


def reward_components(trajectory: Trajectory) -> dict[str, float]:
    """Each reward component summed over the episode's turns."""
    components: dict[str, float] = {}
    for turn in trajectory.turns:
        for name, value in turn.info.get("reward_components", {}).items():
            components[name] = components.get(name, 0.0) + value
    return components


def transcript(trajectory: Trajectory) -> str:
    return "\n\n".join(f"[{m.role}]\n{m.content}" for m in trajectory.messages)


def episode_row(trajectory: Trajectory, episode: int, keep_transcript: bool = False) -> dict[str, Any]:
    """One flat summary line of an episode (what ``rl-llm eval`` writes per episode beside the trajectories)."""
    return {
        "episode": episode,
        "seed": int(trajectory.seed) if trajectory.seed is not None else -1,
        "task_id": trajectory.task_id,
        "episode_return": trajectory.total_reward,
        "turns": len(trajectory.turns),
        "terminated": trajectory.terminated,
        "truncated": trajectory.truncated,
        "invalid_actions": sum(turn.invalid_action for turn in trajectory.turns),
        "metrics": dict(trajectory.metrics),
        "reward_components": reward_components(trajectory),
        "transcript": transcript(trajectory) if keep_transcript else None,
        "error": trajectory.error,
    }


def _figures(record: Trajectory | _EpisodeRecord) -> tuple[float, int, int, dict[str, float]]:
    """(return, turns, invalid actions, metrics) of a trajectory (or of a deprecated ``EpisodeRecord``)."""
    if isinstance(record, Trajectory):
        invalid = sum(turn.invalid_action for turn in record.turns)
        return record.total_reward, len(record.turns), invalid, record.metrics
    return record.episode_return, record.turns, record.invalid_actions, record.metrics


def summarize(records: Sequence[Trajectory | _EpisodeRecord]) -> dict[str, tuple[float, float]]:
    """Mean and 95% half-width of the return, the turns, the invalid actions and every env metric."""
    figures = [_figures(record) for record in records]
    summary = {"return": mean_ci95(f[0] for f in figures), "turns": mean_ci95(f[1] for f in figures)}
    summary["invalid_actions"] = mean_ci95(f[2] for f in figures)
    for name in sorted({name for f in figures for name in f[3]}):
        summary[name] = mean_ci95(f[3].get(name, math.nan) for f in figures)
    return summary


def summary_table(
    title: str, summaries: dict[str, dict[str, tuple[float, float]]], columns: Sequence[str] | None = None
) -> Table:
    """A rich table: one row per agent, one column per figure (all by default), each as mean ± 95% half-width."""
    names = list(columns) if columns is not None else list(
        dict.fromkeys(name for summary in summaries.values() for name in summary)
    )
    table = Table(title=title)
    table.add_column("agent")
    for name in names:
        table.add_column(name, justify="right")
    for agent, summary in summaries.items():
        cells = []
        for name in names:
            mean, half = summary.get(name, (math.nan, math.nan))
            cells.append(f"{mean:.3f}" + ("" if math.isnan(half) else f" ± {half:.3f}"))
        table.add_row(agent, *cells)
    return table


def write_jsonl(records: Sequence[Trajectory | _EpisodeRecord], path: str | Path, **extra: Any) -> Path:
    """One JSON object per episode, its ``episode_row`` (plus ``extra`` fields such as env id and agent name).
    The whole trajectories go to a ``.trajectories.jsonl`` (``evaluate(trajectories_out=...)``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for index, record in enumerate(records):
            row = episode_row(record, index) if isinstance(record, Trajectory) else asdict(record)
            handle.write(json.dumps({**extra, **row}, ensure_ascii=False) + "\n")
    return path


# -- deprecated: the lock-step loop and its record ---------------------------------------------------------
@dataclass
class _EpisodeRecord:
    """Deprecated (``EpisodeRecord``): the record of ``run_episodes``. Every episode is a ``Trajectory`` now
    (``episode_row`` gives these figures)."""

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
    error: str | None = None


_EpisodeRecord.__name__ = _EpisodeRecord.__qualname__ = "EpisodeRecord"  # its repr, and pickles by that name


def run_episodes(
    make_env: Callable[[], gym.Env],
    policy: Policy,
    episodes: int,
    seed: int = 0,
    batch_size: int = 16,
    keep_transcripts: bool = False,
    on_episode: Callable[[_EpisodeRecord], None] | None = None,
) -> list[_EpisodeRecord]:
    """Deprecated: use ``evaluate(make_env, policy, episodes, seed=..., batch_size=...)``, which returns the
    trajectories. Plays through the rollout engine and converts each trajectory to an ``EpisodeRecord``."""
    warnings.warn("run_episodes is deprecated: use rl_llm.agents.evaluate.evaluate (it returns Trajectory "
                  "records)", DeprecationWarning, stacklevel=2)  # fmt: skip

    def record(trajectory: Trajectory) -> _EpisodeRecord:
        return trajectory_record(trajectory, int(trajectory.seed) - seed, keep_transcripts)

    trajectories = evaluate(make_env, policy, episodes, seed=seed, batch_size=batch_size,
                            on_episode=None if on_episode is None else lambda t: on_episode(record(t)))  # fmt: skip
    return [record(trajectory) for trajectory in trajectories]


def trajectory_record(trajectory: Trajectory, episode: int, keep_transcript: bool = False) -> _EpisodeRecord:
    """A trajectory as a (deprecated) ``EpisodeRecord``."""
    return _EpisodeRecord(**episode_row(trajectory, episode, keep_transcript))


def __getattr__(name: str) -> Any:
    if name == "EpisodeRecord":
        warnings.warn("EpisodeRecord is deprecated: every episode is a rl_llm.types.Trajectory (episode_row gives "
                      "the per-episode figures)", DeprecationWarning, stacklevel=2)  # fmt: skip
        return _EpisodeRecord
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def plot_records(records: Sequence[Trajectory | _EpisodeRecord], path: str | Path, title: str = "") -> Path:
    """A PNG with the return distribution (left) and every figure's mean with its 95% interval (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    summary = {name: value for name, value in summarize(records).items() if name != "return"}
    returns = [_figures(record)[0] for record in records]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, max(3.5, 0.35 * len(summary) + 1.5)))
    left.hist(returns, bins=min(30, max(5, len(set(returns)))), color="#4c72b0", edgecolor="white")
    mean, half = mean_ci95(returns)
    left.axvline(mean, color="black", linestyle="--", label=f"mean {mean:.3g}" + ("" if half != half else f" ± {half:.2g}"))
    left.set(xlabel="episode return", ylabel="episodes", title="return distribution")
    left.legend()
    names = list(summary)
    means = [summary[name][0] for name in names]
    errors = [0.0 if summary[name][1] != summary[name][1] else summary[name][1] for name in names]
    right.barh(names, means, xerr=errors, color="#55a868", capsize=3)
    right.invert_yaxis()
    right.set(title="means with 95% intervals")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
