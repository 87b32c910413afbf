"""``OptimalToolCalls``: the OTC reward (docs/research-protocols.md#otc-tool-call-efficiency) over any tool
environment.

With m the episode's tool calls, n the fewest calls known to answer the task, c a smoothing constant and
alpha a scale, the episode's return r becomes ``alpha * r_tool * r``:

- OTC-PPO:  ``r_tool = cos(m pi / (2m + c))``
- OTC-GRPO: ``f(m, n) = 0 if m = n = 0; m if n = 0; 2nm / (m + n) otherwise`` and
  ``r_tool = 1 if f = n = 0; cos(m pi / (2m + c)) if n = 0; sin(f(m, n) pi / (2n)) otherwise``.

Being multiplicative, a wrong answer (r = 0) stays at 0 whatever the calls. n is the task's own count when
the env reports one (``info["optimal_tool_calls"]`` on reset) and the fewest calls of any correct rollout of
the same ``task_id`` seen so far, whichever is smaller; a tracker shared by all wrappers in a process (the
default) pools the rollouts of a GRPO group. Tool productivity is correct answers per tool call.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import gymnasium as gym

from rl_llm.envs.base import reported_correct


def otc_ppo_tool_reward(calls: int, c: float = 1.0) -> float:
    """``cos(m pi / (2m + c))``: 1 with no call, decaying towards 0 as calls grow (faster for smaller c)."""
    if calls < 0:
        raise ValueError(f"tool call count must be >= 0, got {calls}")
    if c <= 0:
        raise ValueError(f"OTC smoothing constant c must be positive, got {c}")
    return math.cos(calls * math.pi / (2 * calls + c))


def otc_mapping(calls: int, optimal: int) -> float:
    """``f(m, n)``: 0 if m = n = 0; m if n = 0; ``2nm / (m + n)`` otherwise (equals n only at m = n)."""
    if calls == 0 and optimal == 0:
        return 0.0
    if optimal == 0:
        return float(calls)
    return 2.0 * optimal * calls / (calls + optimal)


def otc_grpo_tool_reward(calls: int, optimal: int, c: float = 1.0) -> float:
    """1 at m = n, less for fewer or more calls; ``cos(m pi / (2m + c))`` when n = 0."""
    if calls < 0 or optimal < 0:
        raise ValueError(f"tool call counts must be >= 0, got m={calls}, n={optimal}")
    mapped = otc_mapping(calls, optimal)
    if mapped == 0 and optimal == 0:
        return 1.0
    if optimal == 0:
        return otc_ppo_tool_reward(calls, c)
    return math.sin(mapped * math.pi / (2 * optimal))


def tool_productivity(episodes: Iterable[Mapping[str, float]]) -> float:
    """Correct answers per tool call over a set of episodes' metrics (``correct``, ``tool_calls``)."""
    correct = calls = 0.0
    for metrics in episodes:
        correct += metrics["correct"]
        calls += metrics["tool_calls"]
    return correct / calls if calls else math.inf if correct else 0.0


class OptimalCallsTracker:
    """Fewest tool calls among correct rollouts per task id, and running totals. Thread-safe."""

    def __init__(self) -> None:
        self._fewest: dict[str, int] = {}
        self._lock = threading.Lock()
        self.episodes = self.correct = self.calls = 0

    def observe(self, task_id: str, calls: int, correct: bool) -> None:
        with self._lock:
            self.episodes += 1
            self.calls += calls
            if correct:
                self.correct += 1
                self._fewest[task_id] = min(calls, self._fewest.get(task_id, calls))

    def fewest(self, task_id: str) -> int | None:
        with self._lock:
            return self._fewest.get(task_id)

    @property
    def tool_productivity(self) -> float:
        with self._lock:
            return tool_productivity([{"correct": self.correct, "tool_calls": self.calls}])

    def __deepcopy__(self, memo: dict[int, Any]) -> OptimalCallsTracker:
        # A tracker is state shared on purpose (a GRPO group's rollouts pool into one), and Gymnasium deep-copies
        # a wrapper's recorded arguments with its spec: a copy must name this same tracker, as a copied spec
        # names the same callable (a copy of its lock raised, and the wrapped env's spec became None).
        return self

    def state_dict(self) -> dict[str, int]:
        with self._lock:
            return dict(self._fewest)

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        with self._lock:
            self._fewest = {str(task): int(calls) for task, calls in state.items()}


SHARED_TRACKER = OptimalCallsTracker()


class OptimalToolCalls(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Rescale an episode's return by tool-call efficiency (OTC-PPO or OTC-GRPO).

    Arguments: ``variant`` ("grpo" or "ppo"), ``alpha`` (1.0), ``c`` (1.0), ``tracker`` (default: the process-
    wide ``SHARED_TRACKER``), ``use_task_optimum`` (True: take the env's ``optimal_tool_calls`` into n).
    The env must report ``metrics["tool_calls"]``; correctness is what the env reports (``info["correct"]`` or
    ``metrics["correct"]``, see ``attempts.reported_correct``), else a positive return. Rewards before the last step pass through; the last step carries the difference, in
    the ``otc`` reward component, so the episode sums to ``alpha * r_tool * return``. The last step's metrics
    gain ``otc_r_tool`` and (GRPO, when known) ``otc_optimal_calls``.

    Its arguments are recorded (``gymnasium.utils.RecordConstructorArgs``), so ``gym.make(env.spec)`` rebuilds
    it; a ``tracker`` is kept by reference, as Gymnasium keeps a callable, so the rebuilt wrapper pools into the
    same tracker (and, like a callable, it makes ``env.spec.to_json()`` fail).
    """

    def __init__(self, env: gym.Env, variant: str = "grpo", alpha: float = 1.0, c: float = 1.0,
                 tracker: OptimalCallsTracker | None = None, use_task_optimum: bool = True) -> None:  # fmt: skip
        gym.utils.RecordConstructorArgs.__init__(self, variant=variant, alpha=alpha, c=c, tracker=tracker,
                                                 use_task_optimum=use_task_optimum)  # fmt: skip
        if variant not in ("grpo", "ppo"):
            raise ValueError(f"OTC variant must be 'grpo' or 'ppo', got {variant!r}")
        if c <= 0:
            raise ValueError(f"OTC smoothing constant c must be positive, got {c}")
        gym.Wrapper.__init__(self, env)
        self.variant, self.alpha, self.c = variant, float(alpha), float(c)
        self.tracker = SHARED_TRACKER if tracker is None else tracker
        self.use_task_optimum = use_task_optimum
        self._task_id, self._task_optimum, self._paid = "", None, 0.0

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        observation, info = self.env.reset(**kwargs)
        self._task_id = str(info.get("task_id", ""))
        optimum = info.get("optimal_tool_calls")
        self._task_optimum = int(optimum) if self.use_task_optimum and optimum is not None else None
        self._paid = 0.0
        return observation, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        if not (terminated or truncated):
            self._paid += reward
            return observation, reward, terminated, truncated, info
        metrics = dict(info.get("metrics", {}))
        if "tool_calls" not in metrics:
            raise KeyError("OptimalToolCalls needs an environment that reports info['metrics']['tool_calls']")
        calls = int(metrics["tool_calls"])
        base_return = self._paid + reward
        verdict = reported_correct(info)
        correct = verdict if verdict is not None else base_return > 0
        self.tracker.observe(self._task_id, calls, correct)
        r_tool = self._tool_reward(calls, metrics)
        final = self.alpha * r_tool * base_return - self._paid
        metrics["otc_r_tool"] = r_tool
        components = {**info.get("reward_components", {}), "otc": final - reward}
        return observation, final, terminated, truncated, {**info, "metrics": metrics, "reward_components": components}

    def _tool_reward(self, calls: int, metrics: dict[str, float]) -> float:
        if self.variant == "ppo":
            return otc_ppo_tool_reward(calls, self.c)
        known = [n for n in (self._task_optimum, self.tracker.fewest(self._task_id)) if n is not None]
        if not known:  # no correct rollout yet and no task count: n is unknown (+inf), leave the return as is
            return 1.0
        metrics["otc_optimal_calls"] = float(min(known))
        return otc_grpo_tool_reward(calls, min(known), self.c)
