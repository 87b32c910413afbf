"""Reward-level transforms applied between scoring and advantages (docs/research-protocols.md: OTC in
#otc-tool-call-efficiency, PODS in #pods-down-sampling).

- OTC (Optimal Tool Calls): scale a correct answer's reward by how close its number of tool calls ``m`` is to
  the optimum ``n``, estimated as the fewest calls among the group's correct trajectories (and the fewest
  ever seen for that task). The paper form ``r' = alpha * r_tool(m, n) * r`` multiplies the task reward,
  which is >= 0 there (wrong answers stay at 0). Our envs also give negative rewards (penalties, a wrong
  answer's cost), and scaling those by ``r_tool <= 1`` would make a wrong answer *cheaper* the more calls it
  makes; so only the positive part is scaled: ``r' = alpha * r_tool * max(r, 0) + min(r, 0)``. Tool
  efficiency can then only lower a reward, never raise one. The formulas are those of the env-level wrapper
  ``rl_llm.envs.wrappers.otc``; here ``n`` comes from the whole group of the current batch, which a wrapper
  inside one episode cannot see.
- PODS: from ``n`` rollouts of a prompt keep the ``m`` whose rewards have the largest variance; the optimum
  is always the ``k`` highest plus the ``m - k`` lowest rewards for some ``k``, so scanning ``k`` suffices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rl_llm.envs.wrappers.otc import OptimalCallsTracker, otc_grpo_tool_reward, otc_ppo_tool_reward


class OTCTransform:
    """OTC reward over groups of trajectories of the same task.

    ``variant="grpo"`` estimates ``n`` per group, keeping the per-task minimum across steps in an
    ``OptimalCallsTracker`` (the env wrapper's); ``variant="ppo"`` needs no ``n``. A trajectory is correct
    when the env says so (``correct``, from ``reported_correct``), else when its reward is positive, as in
    the wrapper. A group with no correct trajectory is left as is (``n`` is unknown, and its rewards carry
    no tool-efficiency signal).
    """

    def __init__(self, variant: str = "grpo", alpha: float = 1.0, c: float = 1.0) -> None:
        if variant not in ("grpo", "ppo"):
            raise ValueError(f"OTC variant must be 'grpo' or 'ppo', got {variant!r}")
        self.variant = variant
        self.alpha = alpha
        self.c = c
        self.tracker = OptimalCallsTracker()

    def __call__(self, rewards: Sequence[float], calls: Sequence[int], task_ids: Sequence[str],
                 correct: Sequence[bool | None] | None = None) -> list[float]:  # fmt: skip
        """``correct[i]``: the env's verdict on trajectory ``i`` (None: judge by ``rewards[i] > 0``)."""
        if correct is None:
            correct = [None] * len(rewards)
        if not len(rewards) == len(calls) == len(task_ids) == len(correct):
            raise ValueError("rewards, calls, task_ids and correct must have the same length")
        out = [float(r) for r in rewards]
        for task in dict.fromkeys(task_ids):
            members = [i for i, t in enumerate(task_ids) if t == task]
            if self.variant == "ppo":
                for i in members:
                    out[i] = self._scale(out[i], otc_ppo_tool_reward(int(calls[i]), self.c))
                continue
            for i in members:
                verdict = correct[i]
                self.tracker.observe(task, int(calls[i]), rewards[i] > 0 if verdict is None else bool(verdict))
            optimal = self.tracker.fewest(task)
            if optimal is None:
                continue
            for i in members:
                out[i] = self._scale(out[i], otc_grpo_tool_reward(int(calls[i]), optimal, self.c))
        return out

    def _scale(self, reward: float, tool_reward: float) -> float:
        """The paper's ``alpha * r_tool * r`` on the positive part of the reward; penalties stay whole."""
        return self.alpha * tool_reward * reward if reward > 0 else reward

    def state_dict(self) -> dict[str, int]:
        return self.tracker.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.tracker.load_state_dict(state)


def pods_max_variance(rewards: Sequence[float], keep: int) -> list[int]:
    """Indices of the ``keep`` rewards with the largest sample variance (ties: fewest high picks first).

    Sort once, then for every ``k`` in ``0..keep`` take the ``k`` highest and ``keep - k`` lowest: the
    max-variance subset is always of that form. O(n log n) for the sort plus O(keep) per candidate via
    prefix sums.
    """
    values = np.asarray(rewards, dtype=np.float64)
    n = values.size
    if not 1 <= keep <= n:
        raise ValueError(f"PODS must keep between 1 and {n} rollouts, got {keep}")
    if keep == n:
        return list(range(n))
    order = np.argsort(values, kind="stable")
    ranked = values[order]
    sums = np.concatenate([[0.0], np.cumsum(ranked)])
    squares = np.concatenate([[0.0], np.cumsum(ranked**2)])
    best_k, best_var = 0, -math.inf
    for k in range(keep + 1):
        low = keep - k  # lowest `low` and highest `k`
        total = sums[low] + (sums[n] - sums[n - k])
        total_sq = squares[low] + (squares[n] - squares[n - k])
        variance = total_sq / keep - (total / keep) ** 2
        if variance > best_var + 1e-12:
            best_k, best_var = k, variance
    chosen = np.concatenate([order[: keep - best_k], order[n - best_k :]])
    return sorted(int(i) for i in chosen)


def pods_select(rewards: Sequence[float], task_ids: Sequence[str], keep: int) -> list[int]:
    """Apply ``pods_max_variance`` within each task's group; groups of ``keep`` or fewer are kept whole."""
    selected: list[int] = []
    for task in dict.fromkeys(task_ids):
        members = [i for i, t in enumerate(task_ids) if t == task]
        if len(members) <= keep:
            selected += members
            continue
        picks = pods_max_variance([rewards[i] for i in members], keep)
        selected += [members[j] for j in picks]
    return sorted(selected)
