"""What the multi-armed and the contextual bandit share: arm labels, action parsing, the three reward
modes of docs/research-protocols.md#bandits (raw, strategic = regret-shaped, algorithmic = match UCB) and
the metrics of "LLMs are Greedy Agents" (cumulative regret, untried arms, greedy choices).

A subclass draws the instance in ``_draw_instance`` and supplies the per-step expected arm rewards
(``_arm_means``), the noisy sample (``_sample_reward``), the UCB-style reference choice (``_reference_arm``)
and the observation text.
"""

from __future__ import annotations

import hashlib
import math
import string
from collections.abc import Sequence
from typing import Any

import numpy as np

from rl_llm import checks
from rl_llm.envs.base import Outcome, Task, TextEnv
from rl_llm.envs.parsing import extract_tag

ARM_LABELS = string.ascii_uppercase
_ARM_INDEX = {label: index for index, label in enumerate(ARM_LABELS)}
REWARD_MODES = ("raw", "strategic", "algorithmic")
HISTORY_MODES = ("summary", "full")


def ucb1_choice(counts: Sequence[float], sums: Sequence[float], c: float = 0.5) -> np.ndarray:
    """Arms UCB1 would pull next (all ties): untried arms first, else argmax of mean + c*sqrt(2 ln t / n)."""
    counts, sums = np.asarray(counts, dtype=np.float64), np.asarray(sums, dtype=np.float64)
    untried = np.flatnonzero(counts == 0)
    if untried.size:
        return untried
    t = counts.sum()
    index = sums / counts + c * np.sqrt(2.0 * np.log(t) / counts)
    return np.flatnonzero(index >= index.max() - 1e-12)


def parse_arm(action: str, num_arms: int) -> int | None:
    """The arm index of the last ``<action>LABEL</action>`` (also ``Arm B``/``b``), or None."""
    content = extract_tag(action, "action", last=True)
    if content is None:
        return None
    label = content.upper()  # extract_tag has stripped it
    if label.startswith("ARM "):
        label = label[4:].strip()
    arm = _ARM_INDEX.get(label)
    return arm if arm is not None and arm < num_arms else None


class BanditEnv(TextEnv):
    """Shared step logic of the bandit environments (not registered itself)."""

    stop = ("</action>",)
    env_name = "Bandit"

    def __init__(
        self,
        *,
        num_arms: int,
        horizon: int,
        history: str,
        reward_mode: str,
        invalid_action_penalty: float,
        render_mode: str | None,
    ) -> None:
        num_arms = checks.integer("num_arms", num_arms, minimum=2, maximum=len(ARM_LABELS))
        horizon = checks.integer("horizon", horizon, minimum=1)  # NaN, 2.5 and True too (docs of arguments)
        if history not in HISTORY_MODES:
            raise ValueError(f"history must be one of {HISTORY_MODES}, got {history!r}")
        if reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode must be one of {REWARD_MODES}, got {reward_mode!r}")
        invalid_action_penalty = checks.reward("invalid_action_penalty", invalid_action_penalty, minimum=0.0)
        # Every turn is one pull (an invalid turn pulls a random arm), so the horizon is the turn limit.
        super().__init__(max_turns=horizon, render_mode=render_mode)
        self.num_arms = num_arms
        self.horizon = horizon
        self.history = history
        self.reward_mode = reward_mode
        self.invalid_action_penalty = float(invalid_action_penalty)
        self.labels = ARM_LABELS[:num_arms]
        self._label_list = ", ".join(self.labels)  # "A, B, C": shown in prompts, observations and feedback

    def _instance_digest(self, parameters: np.ndarray) -> str:
        """A short id of a drawn instance: its hidden parameters (rounded to 6 decimals) and the horizon."""
        return hashlib.sha1(np.round(parameters, 6).tobytes() + f"{self.horizon}".encode()).hexdigest()[:12]

    # -- hooks for subclasses -------------------------------------------------------------------------
    def _draw_instance(self, options: dict[str, Any]) -> str:
        """Draw the hidden instance; return a task id that identifies it."""
        raise NotImplementedError

    def _arm_means(self) -> list[float]:
        """Expected reward of every arm at the current step."""
        raise NotImplementedError

    def _sample_reward(self, arm: int) -> float:
        raise NotImplementedError

    def _reference_arms(self) -> np.ndarray:
        """Arms the reference algorithm (UCB1 / LinUCB) would pull now, for the algorithmic reward."""
        raise NotImplementedError

    def _record(self, arm: int, reward: float) -> None:
        """Update the algorithm-visible history after a pull."""

    def _system_prompt(self) -> str:
        raise NotImplementedError

    def _observation(self, feedback: str) -> str:
        raise NotImplementedError

    # -- TextEnv --------------------------------------------------------------------------------------
    # The step runs on plain Python lists: with a handful of arms, numpy's per-call overhead would
    # dominate the cost of a step (see benchmarks/env_step.py).
    def _reset(self, options: dict[str, Any]) -> Task:
        self.counts = [0] * self.num_arms
        self.sums = [0.0] * self.num_arms
        # Per arm, kept up to date on each pull (only the pulled arm's entries change): its empirical mean
        # (-inf while untried) and its line of the summary observation.
        self._empirical_means = [-math.inf] * self.num_arms
        self._summary_lines = [f"{label}: 0 pulls" for label in self.labels]
        self.pulls = 0
        self.regret = 0.0
        self.greedy_choices = 0
        self.greedy_opportunities = 0
        self.best_arm_pulls = 0
        self.invalid_actions = 0
        task_id = self._draw_instance(options)
        return Task(observation=self._observation(""), task_id=task_id, system_prompt=self._system_prompt())

    def _is_greedy(self, arm: int) -> bool:
        """Whether ``arm`` has the best empirical mean among tried arms (ties count)."""
        return bool(self.counts[arm]) and self._empirical_means[arm] >= max(self._empirical_means) - 1e-12

    def _step(self, action: str) -> Outcome:
        arm = parse_arm(action, self.num_arms)
        rewards: dict[str, float] = {}
        feedback = ""
        if arm is None:
            self.invalid_actions += 1
            arm = int(self.np_random.integers(self.num_arms))
            rewards["invalid_action"] = -self.invalid_action_penalty
            feedback = (
                f"Invalid action: put exactly one arm label ({self._label_list}) inside "
                f"<action></action>, e.g. <action>{self.labels[0]}</action>. Arm {self.labels[arm]} was pulled "
                "at random for you.\n"
            )
        elif self.pulls:
            self.greedy_opportunities += 1
            self.greedy_choices += self._is_greedy(arm)

        means = self._arm_means()
        best, worst, chosen = max(means), min(means), means[arm]
        reference = self._reference_arms() if self.reward_mode == "algorithmic" else None
        reward = self._sample_reward(arm)
        self.regret += best - chosen
        self.best_arm_pulls += chosen >= best - 1e-12
        if self.reward_mode == "raw":
            rewards["arm_reward"] = reward
        elif self.reward_mode == "strategic":
            rewards["strategic"] = 1.0 if best <= worst else (chosen - worst) / (best - worst)
        else:
            rewards["matches_ucb"] = float(arm in reference)

        count = self.counts[arm] = self.counts[arm] + 1
        total = self.sums[arm] = self.sums[arm] + reward
        mean = self._empirical_means[arm] = total / count
        pulls = "pull" if count == 1 else "pulls"
        self._summary_lines[arm] = f"{self.labels[arm]}: {count} {pulls}, mean reward {mean:.3f}"
        self.pulls += 1
        self._record(arm, reward)
        metrics = {
            "regret": self.regret,
            "arms_untried_frac": self.counts.count(0) / self.num_arms,
            "greedy_share": self.greedy_choices / self.greedy_opportunities if self.greedy_opportunities else 0.0,
            "best_arm_share": self.best_arm_pulls / self.pulls,
            "invalid_actions": float(self.invalid_actions),
        }
        terminated = self.pulls >= self.horizon
        feedback += f"Arm {self.labels[arm]} gave reward {self._format_reward(reward)}."
        observation = self._observation(feedback) if not terminated else feedback + " The game is over."
        return Outcome(
            observation=observation,
            rewards=rewards,
            terminated=terminated,
            invalid_action="invalid_action" in rewards,
            metrics=metrics,
            info={"arm": arm, "sampled_reward": reward},
        )

    def _format_reward(self, reward: float) -> str:
        return f"{reward:.3f}"

    def _arm_summary_lines(self) -> list[str]:
        """``A: 2 pulls, mean reward 0.500`` per arm: the sufficient statistics of the history. The env's own
        list, updated pull by pull: read it, do not change it."""
        return self._summary_lines
