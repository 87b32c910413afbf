"""Run a policy on an environment for N seeded episodes and summarise the results.

``evaluate`` is the one entry point (``rl-llm eval`` uses it): LLM policies play through the rollout engine
(concurrent, token-in token-out; ``trajectories_out`` keeps the full trajectories), baselines through
``run_episodes``, where every live environment's conversation goes to the policy in one ``act`` call.
Episode ``i`` uses seed ``seed + i``, so two agents evaluated with the same seed face the same tasks.
``summarize`` gives means with 95% intervals, ``write_jsonl`` one line per episode, ``plot_records`` a PNG
of the return distribution and the env metrics.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from rich.table import Table

from rl_llm.agents.policy import Policy
from rl_llm.types import Message, Trajectory

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
    error: str | None = None


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
    envs: list[gym.Env] = []
    records: list[EpisodeRecord] = []
    try:
        for _ in range(min(batch_size, episodes)):
            envs.append(make_env())  # inside the try: if one cannot be built, those built are still closed
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


def write_jsonl(records: list[EpisodeRecord], path: str | Path, **extra: Any) -> Path:
    """One JSON object per episode (plus ``extra`` fields such as env id and agent name)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps({**extra, **asdict(record)}, ensure_ascii=False) + "\n")
    return path


def evaluate(
    env_id: str,
    policy: Policy,
    episodes: int,
    *,
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
    batch_size: int = 16,
    keep_transcripts: bool = False,
    on_episode: Callable[[EpisodeRecord], None] | None = None,
    trajectories_out: str | Path | None = None,
) -> list[EpisodeRecord]:
    """Play ``episodes`` seeded episodes with any agent; ``batch_size`` is the number of envs in flight."""
    from rl_llm.agents.llm import LLMPolicy

    env_kwargs = dict(env_kwargs or {})
    if not isinstance(policy, LLMPolicy):
        return run_episodes(
            lambda: gym.make(env_id, **env_kwargs), policy, episodes, seed=seed, batch_size=batch_size,
            keep_transcripts=keep_transcripts, on_episode=on_episode,
        )  # fmt: skip
    from rl_llm.agents.rollout import collect, write_trajectories

    def record(trajectory: Trajectory) -> EpisodeRecord:
        return trajectory_record(trajectory, int(trajectory.seed or 0) - seed, keep_transcripts)

    trajectories = collect(
        env_id, policy, list(range(seed, seed + episodes)), env_kwargs=env_kwargs, concurrency=batch_size,
        on_trajectory=None if on_episode is None else lambda trajectory: on_episode(record(trajectory)),
    )  # fmt: skip
    if trajectories_out is not None:
        write_trajectories(trajectories, trajectories_out)
    return [record(trajectory) for trajectory in trajectories]


def trajectory_record(trajectory: Trajectory, episode: int, keep_transcript: bool = False) -> EpisodeRecord:
    components: dict[str, float] = {}
    for turn in trajectory.turns:
        for name, value in turn.info.get("reward_components", {}).items():
            components[name] = components.get(name, 0.0) + value
    transcript = None
    if keep_transcript:
        transcript = "\n\n".join(f"[{m.role}]\n{m.content}" for m in trajectory.messages)
    return EpisodeRecord(
        episode=episode,
        seed=int(trajectory.seed) if trajectory.seed is not None else -1,
        task_id=trajectory.task_id,
        episode_return=trajectory.total_reward,
        turns=len(trajectory.turns),
        terminated=trajectory.terminated,
        truncated=trajectory.truncated,
        invalid_actions=sum(turn.invalid_action for turn in trajectory.turns),
        metrics=dict(trajectory.metrics),
        reward_components=components,
        transcript=transcript,
        error=trajectory.error,
    )


def plot_records(records: list[EpisodeRecord], path: str | Path, title: str = "") -> Path:
    """A PNG with the return distribution (left) and every figure's mean with its 95% interval (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    summary = {name: value for name, value in summarize(records).items() if name != "return"}
    returns = [record.episode_return for record in records]
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
