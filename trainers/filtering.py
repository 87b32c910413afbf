"""Dynamic sampling (online filtering): drop groups that carry no learning signal and replace them with fresh
groups from the task stream (docs/training.md#dynamic-sampling).

A group is the ``group_size`` episodes of one task seed. Two gates, either or both (``rollout.filter``):

- ``zero_variance`` (DAPO's dynamic sampling): drop a group whose episodes all got the same return; its GRPO
  advantages are all zero, so it costs generation time and teaches nothing.
- ``advantage_range: r`` (a prime-rl-style gate): drop a group when every centred return ``R_i - mean_G(R)``
  lies in ``[-r, r]``. The gate reads centred returns, not the std-normalised GRPO advantages: those have unit
  spread for any group with two different returns, so a gate on them would pass a group whose returns differ
  by a rounding error.

Dropped groups are replaced: the loop draws new seeds (the next ones of the task stream) for the groups still
missing, plays them, and gates them again, until ``prompts_per_step`` groups pass or ``max_extra_groups``
replacement groups have been drawn this step (DAPO samples without a bound; verl and prime-rl bound the
number of generation rounds, as here). A step that ends short trains on the groups that passed; where they hold
fewer episodes than ``optim.minibatches`` (or none passed), the dropped groups are taken back in the order they
were drawn until there are enough (counted as ``groups/readmitted``), so a step never has an empty batch.

The filter reads each episode's raw return (the env's rewards), before OTC and PODS. Every drawn seed is
consumed, passed or not: the synchronous loop's ``next_seed`` and the asynchronous loop's seed ledger move
past dropped groups too, so a resumed run never plays a dropped group again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rl_llm.types import Trajectory


@dataclass
class FilterConfig:
    """``rollout.filter``: which groups a step trains on (docs/training.md#dynamic-sampling)."""

    zero_variance: bool = False  # DAPO: drop groups whose returns are all equal
    advantage_range: float | None = None  # drop groups whose centred returns all lie in [-r, r]; None: off
    max_extra_groups: int = 0  # replacement groups a step may draw beyond prompts_per_step (0: drop, no refill)

    @property
    def enabled(self) -> bool:
        return self.zero_variance or self.advantage_range is not None


def check_filter_config(train: Any) -> None:
    """Refuse what cannot run (``train`` is the whole TrainConfig)."""
    from rl_llm.trainers.config import ConfigError  # lazy: config imports this module

    config: FilterConfig = train.rollout.filter
    if config.enabled and train.game is not None:
        raise ConfigError(f"rollout.filter: not available for two-player games ({train.env.id}) yet")
    if config.advantage_range is not None and config.advantage_range < 0:
        raise ConfigError(f"rollout.filter.advantage_range must be null (off) or >= 0, got {config.advantage_range}")
    if config.max_extra_groups < 0:
        raise ConfigError(f"rollout.filter.max_extra_groups must be >= 0, got {config.max_extra_groups}")
    if config.max_extra_groups > 0 and not config.enabled:
        raise ConfigError("rollout.filter.max_extra_groups needs a gate: set rollout.filter.zero_variance=true "
                          "or rollout.filter.advantage_range")  # fmt: skip


def group_passes(returns: list[float], config: FilterConfig) -> bool:
    """Whether a group with these episode returns carries signal under the configured gates."""
    if len(returns) < 2:  # one usable episode (the rest failed): no group baseline, nothing to compare
        return not config.enabled
    mean = sum(returns) / len(returns)
    if config.zero_variance and max(returns) == min(returns):
        return False
    gate = config.advantage_range
    return gate is None or any(abs(r - mean) > gate for r in returns)


def by_seed(trajectories: list[Trajectory]) -> dict[int | None, list[Trajectory]]:
    """The episodes grouped by task seed, in order of first appearance (a group = one seed)."""
    groups: dict[int | None, list[Trajectory]] = {}
    for trajectory in trajectories:
        groups.setdefault(trajectory.seed, []).append(trajectory)
    return groups


def passes(group: list[Trajectory], config: FilterConfig) -> bool:
    usable = [t.total_reward for t in group if t.error is None and t.num_policy_tokens > 0]
    return group_passes(usable, config)


@dataclass
class GroupCounts:
    """How a step got its groups: drawn (played), kept (passed the gate), dropped, readmitted (taken back)."""

    drawn: int = 0
    kept: int = 0
    dropped: int = 0
    readmitted: int = 0
    rounds: int = 0  # generation rounds (1 + replacement rounds)
    dropped_seeds: list[int] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        return {"groups/drawn": float(self.drawn), "groups/kept": float(self.kept),
                "groups/dropped": float(self.dropped), "groups/readmitted": float(self.readmitted),
                "groups/rounds": float(self.rounds)}  # fmt: skip


def fill_groups(play: Callable[[list[int]], list[Trajectory]], draw: Callable[[int], list[int]], seeds: list[int],
                needed: int, config: FilterConfig, min_episodes: int) -> tuple[list[Trajectory], GroupCounts]:
    """Play ``seeds``, gate the groups, and replace dropped ones with groups of ``draw(n)`` new seeds, up to
    ``config.max_extra_groups`` of them, until ``needed`` groups pass. Returns the episodes to train on (kept
    groups in the order drawn, then any readmitted) and the counts."""
    counts = GroupCounts()
    kept: list[list[Trajectory]] = []
    dropped: list[list[Trajectory]] = []
    extra = 0
    while True:
        counts.rounds += 1
        counts.drawn += len(seeds)
        for group in by_seed(play(seeds)).values():
            (kept if passes(group, config) else dropped).append(group)
        missing = needed - len(kept)
        room = config.max_extra_groups - extra
        if missing <= 0 or room <= 0:
            break
        seeds = draw(min(missing, room))
        extra += len(seeds)
    counts.kept, counts.dropped = len(kept), len(dropped)
    counts.dropped_seeds = [group[0].seed for group in dropped]
    chosen = kept + readmit(kept, dropped, min_episodes)
    counts.readmitted = len(chosen) - len(kept)
    return [t for group in chosen for t in group], counts


def readmit(kept: list[list[Trajectory]], dropped: list[list[Trajectory]], min_episodes: int) -> list[list[Trajectory]]:
    """Dropped groups taken back (in the order drawn) until the batch holds a group and ``min_episodes`` episodes."""
    back: list[list[Trajectory]] = []
    episodes = sum(len(group) for group in kept)
    for group in dropped:
        if (kept or back) and episodes >= min_episodes:
            break
        back.append(group)
        episodes += len(group)
    return back


def collect_step(run: Any, seeds: list[int]) -> tuple[list[Trajectory], dict[str, float]]:
    """The synchronous loop's step of collection: the groups of ``seeds`` at the curriculum's options
    (trainers/curriculum.py), gated and refilled from ``run.next_seed`` on when a filter is set; returns the
    episodes to train on and the step's group counts and curriculum mix."""
    from rl_llm.agents.rollout import EpisodeJob, RolloutEngine

    config = run.config
    rollout = config.rollout

    def play(batch: list[int]) -> list[Trajectory]:
        jobs = [EpisodeJob(seed=seed, group_index=g, options=run.tasks.options_for(seed))
                for seed in batch for g in range(rollout.group_size)]  # fmt: skip
        engine = RolloutEngine(run.generator, run.train_env, max_new_tokens=rollout.max_new_tokens,
                               concurrency=rollout.concurrency)  # fmt: skip
        played = engine.run(jobs)
        run.tasks.observe(played)  # every drawn group teaches the curriculum, kept or dropped
        return played

    def draw(count: int) -> list[int]:  # the next seeds of the task stream: consumed whether kept or not
        start, run.next_seed = run.next_seed, run.next_seed + count
        return list(range(start, start + count))

    if rollout.filter.enabled:
        trajectories, counts = fill_groups(play, draw, seeds, rollout.prompts_per_step, rollout.filter,
                                           config.optim.minibatches)  # fmt: skip
    else:
        trajectories = play(seeds)
        counts = GroupCounts(drawn=len(seeds), kept=len(seeds), rounds=1)
    return trajectories, counts.metrics() | run.tasks.step_metrics()
