"""Curricula: which task (and at which difficulty) each training group plays (docs/training.md#curricula).

The trainer owns task selection (docs/design.md#the-trainer-loop): group ``s`` is the task of seed ``s``. A
``TaskSampler`` adds, per seed, the reset options that set its difficulty, and learns from the finished
groups. Three kinds (``curriculum.kind``):

- ``fixed``: no options; every task at the env's configured difficulty (the trainer without a curriculum).
- ``levels`` (reasoning-gym's curricula): ``curriculum.levels`` lists the values of one env argument
  (``curriculum.option``), easiest first. Tasks are drawn at the current level; once ``window`` episodes have
  been played at it, the level goes up when their success rate is at least ``promote_at`` and down when it is at
  most ``demote_at`` (reasoning-gym's success/failure thresholds over the last k rewards), and the window starts
  again. ``review_frac`` of the tasks are drawn at a lower level, uniformly (0: none; reasoning-gym samples
  at the current level only).
- ``pools`` (prime-rl's easy/normal/hard buffer): a fixed set of ``num_tasks`` tasks (``task_index`` 0..n-1,
  for envs with a task set or generated tasks addressed by index). Each task keeps a running reward, an
  exponential average of its groups' mean returns (``ema``); tasks at or above ``easy_above`` are easy, at or
  below ``hard_below`` hard, the rest (and tasks never played) normal. Each group draws a pool by
  ``pool_weights`` (renormalised over the non-empty pools), then a task uniformly within it. prime-rl moves
  tasks between pools by the last step's reward and samples the easy and hard pools at fixed fractions; the
  running average here is smoother over few plays per task.

A level is set through the env's constructor (``via: kwargs``: one env per level, built on first use, e.g.
TicTacToe's ``opponent_skill``, Math-v0's ``difficulty``, Search's ``hops``) or through ``reset`` options
(``via: reset``, e.g. Terminal-v0's ``difficulty``). Every draw is a pure function of the run seed, the group
seed and the sampler's state, and that state is in the checkpoint, so a resumed run draws the same tasks.
Success is the env metric ``success_metric`` (``correct``, TicTacToe's ``win``...) when the episode reports it,
else a positive return.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from rl_llm.types import Trajectory

KINDS = ("fixed", "levels", "pools")
LEVEL_OPTION = "rl_llm_curriculum_level"  # the reset option LevelledEnv reads (and removes) for via=kwargs


@dataclass
class CurriculumConfig:
    """``curriculum``: the trainer's task sampler (docs/training.md#curricula)."""

    kind: str = "fixed"  # fixed | levels | pools
    option: str | None = None  # the env argument a level sets (difficulty, opponent_skill, hops, ...)
    via: str = "kwargs"  # kwargs: the env is built with option=level | reset: reset(options={option: level})
    levels: list[Any] = field(default_factory=list)  # the option's values, easiest first
    start: int = 0  # index of the first level
    window: int = 64  # episodes at a level before it may change
    promote_at: float = 0.7  # success rate over the window that moves a level up
    demote_at: float = 0.1  # ... and down
    review_frac: float = 0.0  # share of groups drawn at a lower level, uniformly
    success_metric: str = "correct"  # env metric read as success (>= 0.5); a positive return when absent
    num_tasks: int | None = None  # pools: task_index 0..n-1; None: the env's task set size
    easy_above: float = 0.8  # pools: running reward at or above this is easy
    hard_below: float = 0.2  # ... at or below this is hard
    pool_weights: dict[str, float] = field(default_factory=lambda: {"easy": 0.1, "normal": 0.8, "hard": 0.1})
    ema: float = 0.5  # pools: weight of a new group's mean return in a task's running reward


def check_curriculum_config(config: Any) -> None:
    """Refuse what cannot run, with the key's name (``config`` is the whole TrainConfig)."""
    from rl_llm.envs.registration import declared_reset_options
    from rl_llm.trainers.config import ConfigError  # lazy: config imports this module

    cur: CurriculumConfig = config.curriculum
    if cur.kind not in KINDS:
        raise ConfigError(f"curriculum.kind: {cur.kind!r} is not one of {list(KINDS)}")
    if cur.kind == "fixed":
        return
    if config.game is not None:
        raise ConfigError(f"curriculum: not available for two-player games ({config.env.id})")
    if config.rollout.max_staleness is not None:
        raise ConfigError("curriculum: not implemented for the asynchronous loop (rollout.max_staleness) yet; "
                          "use the synchronous loop (rollout.max_staleness=null)")  # fmt: skip
    if cur.via not in ("kwargs", "reset"):
        raise ConfigError(f"curriculum.via: {cur.via!r} is not one of ['kwargs', 'reset']")
    if cur.kind == "levels":
        if not cur.option or len(cur.levels) < 2:
            raise ConfigError("curriculum.kind=levels needs curriculum.option (the env argument, e.g. difficulty) "
                              "and at least two curriculum.levels")  # fmt: skip
        if not 0 <= cur.start < len(cur.levels):
            raise ConfigError(f"curriculum.start must index curriculum.levels (0..{len(cur.levels) - 1})")
        if cur.window < 1 or not 0 <= cur.demote_at < cur.promote_at <= 1:
            raise ConfigError("curriculum: need window >= 1 and 0 <= demote_at < promote_at <= 1")
        if not 0 <= cur.review_frac < 1:
            raise ConfigError(f"curriculum.review_frac must be in [0, 1), got {cur.review_frac}")
    # The reset option the curriculum sets must be one the env reads, or every level/pool is the same episode.
    option = "task_index" if cur.kind == "pools" else cur.option if cur.via == "reset" else None
    takes = declared_reset_options(config.env.id) if option else None
    if takes is not None and option not in takes:
        what = "curriculum.kind=pools picks tasks by" if cur.kind == "pools" else "curriculum.option is"
        raise ConfigError(f"{what} the reset option {option!r}, which {config.env.id} does not read; its reset "
                          f"options are {', '.join(sorted(takes)) or 'none'}"
                          + ("" if cur.kind == "pools" else " (curriculum.via=kwargs sets a constructor argument)"))
    if cur.kind == "pools":
        if set(cur.pool_weights) - {"easy", "normal", "hard"} or any(w < 0 for w in cur.pool_weights.values()) \
                or sum(cur.pool_weights.values()) <= 0:  # fmt: skip
            raise ConfigError("curriculum.pool_weights: weights >= 0 for easy, normal and hard, not all 0")
        if not cur.hard_below < cur.easy_above or not 0 < cur.ema <= 1:
            raise ConfigError("curriculum: need hard_below < easy_above and 0 < ema <= 1")
        if cur.num_tasks is not None and cur.num_tasks < 1:
            raise ConfigError(f"curriculum.num_tasks must be >= 1, got {cur.num_tasks}")


def episode_success(trajectory: Trajectory, metric: str) -> bool:
    value = trajectory.metrics.get(metric)
    return bool(value >= 0.5) if value is not None else trajectory.total_reward > 0


class LevelledEnv(gym.Env):
    """One env per level of a constructor argument, chosen at each reset by ``options[LEVEL_OPTION]``.

    The rollout engine reuses envs across episodes; this lets one of its envs play any level. Envs are built
    on first use and kept; ``spec`` and ``unwrapped`` are those of the level played last.
    """

    def __init__(self, make_level: Callable[[Any], gym.Env], default: Any) -> None:
        self._make_level = make_level
        self._envs: dict[str, gym.Env] = {}
        self._current = self._env(default)
        self.observation_space, self.action_space = self._current.observation_space, self._current.action_space

    def _env(self, level: Any) -> gym.Env:
        key = repr(level)
        if key not in self._envs:
            self._envs[key] = self._make_level(level)
        return self._envs[key]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        options = dict(options or {})
        env = self._env(options.pop(LEVEL_OPTION)) if LEVEL_OPTION in options else self._current
        result = env.reset(seed=seed, options=options or None)
        self._current = env  # only now: a reset the level's env refuses leaves the running episode in play
        return result

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        return self._current.step(action)

    def render(self) -> Any:
        return self._current.render()

    def close(self) -> None:
        for env in self._envs.values():
            env.close()

    @property
    def spec(self) -> Any:  # type: ignore[override]
        return self._current.spec

    @spec.setter
    def spec(self, value: Any) -> None:  # gym.Env assigns None at class level; ours follows the inner env
        pass

    @property
    def unwrapped(self) -> gym.Env:
        return self._current.unwrapped


def train_env_factory(config: Any, make_env: Callable[[], gym.Env]) -> Callable[[], gym.Env]:
    """The env factory of training episodes: a ``LevelledEnv`` (the config's env with ``option=level``) when
    the curriculum sets a constructor argument, else ``make_env`` itself (what evaluation plays)."""
    cur: CurriculumConfig = config.curriculum
    if cur.kind != "levels" or cur.via != "kwargs":
        return make_env

    def make_level(level: Any) -> gym.Env:
        from rl_llm.envs.wrappers.action_template import ActionTemplate

        env = gym.make(config.env.id, **{**config.env.kwargs, cur.option: level})
        return ActionTemplate(env, config.env.action_template) if config.env.action_template else env

    return lambda: LevelledEnv(make_level, cur.levels[cur.start])


class TaskSampler:
    """Reset options per group seed, and what the finished groups teach the curriculum. Thread-safe."""

    def __init__(self, config: Any, task_count: Callable[[], int] | None = None) -> None:
        self.config: CurriculumConfig = config.curriculum
        self.run_seed = int(config.seed)
        self.level = self.config.start
        self.window: list[bool] = []  # successes at the current level since it last changed
        self.running: dict[int, float] = {}  # pools: task_index -> running reward
        self.num_tasks = self.config.num_tasks
        if self.config.kind == "pools" and self.num_tasks is None:
            try:
                self.num_tasks = task_count() if task_count is not None else None
            except (AttributeError, TypeError):  # an env without a task set (generated tasks)
                self.num_tasks = None
            if not self.num_tasks:
                from rl_llm.trainers.config import ConfigError

                raise ConfigError(f"curriculum.num_tasks: {config.env.id} has no task set; give the pool size")
        self._drawn: dict[int, tuple[str, Any]] = {}  # seed -> (label, option value), until observed
        self._step_labels: list[str] = []
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self.config.kind != "fixed"

    # -- drawing ------------------------------------------------------------------------------------------
    def options_for(self, seed: int) -> dict[str, Any] | None:
        """The reset options of group ``seed`` (None for ``fixed``); the same seed gets the same options until
        its group is observed."""
        if not self.active:
            return None
        with self._lock:
            if seed not in self._drawn:
                self._drawn[seed] = self._draw(np.random.default_rng([self.run_seed, int(seed), 7919]))
                self._step_labels.append(self._drawn[seed][0])
            value = self._drawn[seed][1]
        if self.config.kind == "pools":
            return {"task_index": value}
        key = LEVEL_OPTION if self.config.via == "kwargs" else self.config.option
        return {key: value}

    def _draw(self, rng: np.random.Generator) -> tuple[str, Any]:
        cur = self.config
        if cur.kind == "levels":
            level = self.level
            if level > 0 and cur.review_frac > 0 and rng.random() < cur.review_frac:
                level = int(rng.integers(level))
            return f"level_{level}", cur.levels[level]
        pools = self.pools()
        names = [name for name in ("easy", "normal", "hard") if pools[name] and cur.pool_weights.get(name, 0) > 0]
        if not names:  # every non-empty pool has weight 0: draw from all tasks
            return "normal", int(rng.integers(self.num_tasks))
        weights = np.array([cur.pool_weights[name] for name in names], dtype=np.float64)
        name = names[int(rng.choice(len(names), p=weights / weights.sum()))]
        return name, int(pools[name][int(rng.integers(len(pools[name])))])

    def pools(self) -> dict[str, list[int]]:
        """Task indices per pool, by running reward (tasks never played are normal)."""
        cur = self.config
        pools: dict[str, list[int]] = {"easy": [], "normal": [], "hard": []}
        for task in range(self.num_tasks or 0):
            reward = self.running.get(task)
            name = "normal" if reward is None else "easy" if reward >= cur.easy_above else \
                "hard" if reward <= cur.hard_below else "normal"  # fmt: skip
            pools[name].append(task)
        return pools

    # -- learning -----------------------------------------------------------------------------------------
    def observe(self, trajectories: Sequence[Trajectory]) -> None:
        """Update the curriculum with finished groups (every drawn group, filtered out or not), in seed order."""
        if not self.active:
            return
        groups: dict[int, list[Trajectory]] = {}
        for t in trajectories:
            groups.setdefault(int(t.seed), []).append(t)
        with self._lock:
            for seed in sorted(groups):
                label, value = self._drawn.pop(seed, (None, None))
                played = [t for t in groups[seed] if t.error is None]
                if label is None or not played:
                    continue
                if self.config.kind == "levels":
                    if label == f"level_{self.level}":  # review groups do not move the level
                        self.window += [episode_success(t, self.config.success_metric) for t in played]
                        self._maybe_move()
                else:
                    mean = float(np.mean([t.total_reward for t in played]))
                    old = self.running.get(value)
                    self.running[value] = mean if old is None else (1 - self.config.ema) * old + self.config.ema * mean

    def _maybe_move(self) -> None:
        cur = self.config
        if len(self.window) < cur.window:
            return
        rate = sum(self.window) / len(self.window)
        if rate >= cur.promote_at and self.level < len(cur.levels) - 1:
            self.level += 1
        elif rate <= cur.demote_at and self.level > 0:
            self.level -= 1
        self.window = []  # reasoning-gym judges the last k episodes; here a fresh window after each decision

    def step_metrics(self) -> dict[str, float]:
        """The mix of this step's drawn groups (share per level or pool) and the curriculum's state; resets the
        step's tally."""
        if not self.active:
            return {}
        with self._lock:
            labels, self._step_labels = self._step_labels, []
            out = {f"curriculum/{label}_frac": labels.count(label) / len(labels) for label in sorted(set(labels))}
            if self.config.kind == "levels":
                out["curriculum/level"] = float(self.level)
                if self.window:  # the success rate the next decision will read, so far
                    out["curriculum/window_success"] = sum(self.window) / len(self.window)
                for index in range(len(self.config.levels)):
                    out.setdefault(f"curriculum/level_{index}_frac", 0.0)
            else:
                for name, tasks in self.pools().items():
                    out[f"curriculum/{name}_tasks"] = float(len(tasks))
                    out.setdefault(f"curriculum/{name}_frac", 0.0)
        return out

    # -- checkpoints --------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"level": self.level, "window": list(self.window),
                    "running": {str(k): v for k, v in self.running.items()}}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.level = int(state.get("level", self.config.start))
            self.window = [bool(x) for x in state.get("window", [])]
            self.running = {int(k): float(v) for k, v in state.get("running", {}).items()}
