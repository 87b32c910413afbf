"""Environments on Ray actors, behind the ordinary Gymnasium API, for when one machine is not enough.

``RayEnvPool(env_factory, num_workers=8, resources_per_worker={"num_cpus": 2})`` starts ``num_workers`` actors
(spread over the cluster's nodes). Calling the pool returns a :class:`RayEnv`: a ``gym.Env`` whose ``reset``
and ``step`` run on one of the actors, so anything that takes ``make_env`` (the rollout engine, ``evaluate``)
uses remote envs unchanged::

    pool = RayEnvPool(EnvFactory("rl-llm/TicTacToe-v0"), num_workers=4)  # rl_llm.envs.EnvFactory
    trajectories = evaluate(pool, policy, episodes=64)

Failure handling. When an actor dies (node lost, OOM, ``ray.kill``) or a call exceeds ``call_timeout_s`` (the
actor is then killed), the pool starts a replacement actor and every env that lived on the dead one is
rebuilt there on its next call. With ``on_failure="replay"`` (default) the episode is restored by replaying
its seed, options and actions on the new env — envs are deterministic given seed and options — and each
replayed observation and reward is checked against the recorded one; the call then proceeds, so the episode
continues as if nothing happened. When replay is impossible (an unseeded reset, a mismatch, more than
``max_restarts`` failures in one call) or ``on_failure="raise"``, the call raises :class:`EpisodeLost`, which
names the episode: an episode is never silently dropped.

Ray is imported only when a pool is created (``pip install "rl-llm[ray]"``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from rl_llm.checks import integer, seconds
from rl_llm.envs.base import MAX_TEXT_LENGTH
from rl_llm.envs.spaces import UnicodeText

StepResult = tuple[str, float, bool, bool, dict[str, Any]]


class EpisodeLost(RuntimeError):
    """An env's actor failed and its episode could not be restored; the attributes say which episode."""

    def __init__(self, message: str, seed: int | None, options: dict[str, Any], turns: int) -> None:
        super().__init__(f"{message} (episode seed={seed}, options={options}, after {turns} turns)")
        self.seed, self.options, self.turns = seed, options, turns


class EnvHost:
    """The actor body: a set of envs built from one factory, addressed by integer handles."""

    def __init__(self, env_factory: Callable[[], gym.Env]) -> None:
        from rl_llm.envs.registration import register_envs

        register_envs()  # a fresh worker process has not imported rl_llm
        self.env_factory = env_factory
        self.envs: dict[int, gym.Env] = {}

    def create(self, handle: int) -> None:
        self.envs[handle] = self.env_factory()

    def reset(self, handle: int, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        return self.envs[handle].reset(seed=seed, options=options)

    def step(self, handle: int, action: str) -> StepResult:
        return self.envs[handle].step(action)

    def get(self, handle: int, name: str) -> Any:
        return getattr(self.envs[handle].unwrapped, name)

    def close_env(self, handle: int) -> None:
        env = self.envs.pop(handle, None)
        if env is not None:
            env.close()

    def ping(self) -> int:
        return os.getpid()


@dataclass
class PoolStats:
    actor_restarts: int = 0
    episodes_replayed: int = 0
    episodes_lost: int = 0


@dataclass
class _Worker:
    actor: Any
    generation: int
    envs: int = 0


class RayEnvPool:
    """``num_workers`` Ray actors hosting envs; ``pool()`` returns a new :class:`RayEnv` on the least-loaded one."""

    def __init__(
        self,
        env_factory: Callable[[], gym.Env],
        num_workers: int = 2,
        resources_per_worker: dict[str, float] | None = None,
        max_concurrency: int = 16,
        call_timeout_s: float = 300.0,
        max_restarts: int = 3,
        on_failure: str = "replay",
        spread: bool = True,
        ray_init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        # Checked before Ray starts (and without it installed): a float count failed in range() after ray.init,
        # a NaN timeout made every call time out and be retried as an actor failure.
        num_workers = integer("num_workers", num_workers, minimum=1)
        max_concurrency = integer("max_concurrency", max_concurrency, minimum=1)
        call_timeout_s = seconds("call_timeout_s", call_timeout_s)
        max_restarts = integer("max_restarts", max_restarts)
        if on_failure not in ("replay", "raise"):
            raise ValueError(f"on_failure must be 'replay' or 'raise', got {on_failure!r}")
        import ray

        if not ray.is_initialized():
            ray.init(**(ray_init_kwargs or {}))
        resources = dict(resources_per_worker or {})
        options: dict[str, Any] = {"max_concurrency": max_concurrency, "max_restarts": 0}
        options["num_cpus"] = resources.pop("num_cpus", 1)
        for key in ("num_gpus", "memory"):
            if key in resources:
                options[key] = resources.pop(key)
        if resources:
            options["resources"] = resources  # custom resources, e.g. {"sandbox": 1}
        if spread:
            options["scheduling_strategy"] = "SPREAD"
        self._actor_class = ray.remote(EnvHost).options(**options)
        self.env_factory = env_factory
        self.call_timeout_s = call_timeout_s
        self.max_restarts = max_restarts
        self.on_failure = on_failure
        self.stats = PoolStats()
        self._lock = threading.Lock()
        self._handles = itertools.count()
        self._workers = [_Worker(self._actor_class.remote(env_factory), 0) for _ in range(num_workers)]
        ray.get([worker.actor.ping.remote() for worker in self._workers], timeout=call_timeout_s)  # fail fast

    # -- for RayEnv --------------------------------------------------------------------------------------------
    def __call__(self) -> RayEnv:
        with self._lock:
            index = min(range(len(self._workers)), key=lambda i: self._workers[i].envs)
            self._workers[index].envs += 1
        return RayEnv(self, index, next(self._handles))

    @property
    def actors(self) -> list[Any]:
        """The live actor handles (for inspection; ``ray.kill`` one to test failure handling)."""
        return [worker.actor for worker in self._workers]

    def worker(self, index: int) -> tuple[Any, int]:
        with self._lock:
            worker = self._workers[index]
            return worker.actor, worker.generation

    def replace(self, index: int, failed_generation: int) -> None:
        """Replace worker ``index`` if it is still the generation that failed (one replacement per failure)."""
        import ray

        with self._lock:
            worker = self._workers[index]
            if worker.generation != failed_generation:
                return  # another env on the same actor already replaced it
            ray.kill(worker.actor, no_restart=True)
            worker.actor = self._actor_class.remote(self.env_factory)
            worker.generation += 1
            self.stats.actor_restarts += 1

    def release(self, index: int) -> None:
        with self._lock:
            self._workers[index].envs -= 1

    def count(self, name: str) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)

    def close(self) -> None:
        import ray

        with self._lock:
            for worker in self._workers:
                ray.kill(worker.actor, no_restart=True)

    def __enter__(self) -> RayEnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _Episode:
    seed: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    started: bool = False
    steps: list[tuple[str, StepResult]] = field(default_factory=list)


class RayEnv(gym.Env[str, str]):
    """One env on a pool actor. Reads of other public attributes (``env.unwrapped.max_turns``, the transcript)
    are forwarded to the remote env's ``unwrapped``."""

    def __init__(self, pool: RayEnvPool, worker_index: int, handle: int) -> None:
        self._pool, self._index, self._handle = pool, worker_index, handle
        self._generation = -1  # the actor generation this env was built on
        self._episode = _Episode()
        self._closed = False
        self.observation_space = UnicodeText(MAX_TEXT_LENGTH)
        self.action_space = UnicodeText(MAX_TEXT_LENGTH)
        self.spec = self.remote_attr("spec")  # builds the env on its actor; the rollout engine reads env.spec.id

    # -- the Gymnasium API -------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self._episode = _Episode(seed, dict(options or {}))
        result = self._call(lambda actor: actor.reset.remote(self._handle, seed, options), restore=False)
        self._episode.started = True
        return result

    def step(self, action: str) -> StepResult:
        result = self._call(lambda actor: actor.step.remote(self._handle, action), restore=True)
        self._episode.steps.append((action, result))
        return result

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.release(self._index)
        import ray

        actor, generation = self._pool.worker(self._index)
        if generation == self._generation:
            # a dead actor took its envs with it: nothing left to close
            with contextlib.suppress(ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                ray.get(actor.close_env.remote(self._handle), timeout=self._pool.call_timeout_s)

    @property
    def transcript(self) -> str:
        return self.remote_attr("transcript")

    def render(self) -> str | None:
        return self.transcript

    def remote_attr(self, name: str) -> Any:
        """``getattr(env.unwrapped, name)`` on the actor (the value must be picklable)."""
        return self._call(lambda actor: actor.get.remote(self._handle, name), restore=True)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.remote_attr(name)

    # -- calls with failure handling -------------------------------------------------------------------------
    def _call(self, submit: Callable[[Any], Any], restore: bool) -> Any:
        import ray

        failures = 0
        while True:
            actor, generation = self._pool.worker(self._index)
            try:
                if generation != self._generation:
                    self._rebuild(actor, generation, restore)
                return ray.get(submit(actor), timeout=self._pool.call_timeout_s)
            except ray.exceptions.RayTaskError as error:
                raise error.as_instanceof_cause() from None  # the env itself raised: not an actor failure
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as error:
                failures += 1
                self._pool.replace(self._index, generation)
                episode_at_stake = restore and self._episode.started
                if failures > self._pool.max_restarts or (episode_at_stake and self._pool.on_failure == "raise"):
                    self._lose(f"env actor failed ({type(error).__name__}: {error})")

    def _rebuild(self, actor: Any, generation: int, restore: bool) -> None:
        """Build this env on a (new) actor; for a running episode, replay it there and check every step."""
        import ray

        first_build = self._generation == -1
        ray.get(actor.create.remote(self._handle), timeout=self._pool.call_timeout_s)
        self._generation = generation
        episode = self._episode
        if first_build or not (restore and episode.started):
            return
        if self._pool.on_failure == "raise":
            self._lose("env actor failed")
        if episode.seed is None:
            self._lose("env actor failed and an unseeded episode cannot be replayed")
        timeout = self._pool.call_timeout_s
        ray.get(actor.reset.remote(self._handle, episode.seed, episode.options), timeout=timeout)
        for action, expected in episode.steps:
            replayed = ray.get(actor.step.remote(self._handle, action), timeout=timeout)
            if replayed[:4] != expected[:4]:
                self._lose("env actor failed and the replayed episode diverged (is the env deterministic?)")
        self._pool.count("episodes_replayed")

    def _lose(self, message: str) -> None:
        self._pool.count("episodes_lost")
        episode = self._episode
        self._episode = _Episode()
        raise EpisodeLost(message, episode.seed, episode.options, len(episode.steps))
