"""Contextual (linear) bandit played through text."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from rl_llm.envs.bandit_base import BanditEnv


def format_vector(vector: np.ndarray) -> str:
    return "[" + ", ".join(f"{value:.2f}" for value in vector) + "]"


class LinUCB:
    """Disjoint LinUCB (Li et al. 2010) with Sherman-Morrison updates; used by the env for the
    algorithmic reward and by the LinUCB baseline agent."""

    def __init__(self, num_arms: int, dim: int, alpha: float = 1.0) -> None:
        self.alpha = alpha
        self.a_inv = np.repeat(np.eye(dim)[None], num_arms, axis=0)
        self.b = np.zeros((num_arms, dim))

    def scores(self, context: np.ndarray) -> np.ndarray:
        theta = np.einsum("kij,kj->ki", self.a_inv, self.b)
        width = np.sqrt(np.einsum("i,kij,j->k", context, self.a_inv, context))
        return theta @ context + self.alpha * width

    def choices(self, context: np.ndarray) -> np.ndarray:
        scores = self.scores(context)
        return np.flatnonzero(scores >= scores.max() - 1e-12)

    def update(self, arm: int, context: np.ndarray, reward: float) -> None:
        a_inv = self.a_inv[arm]
        projected = a_inv @ context
        self.a_inv[arm] = a_inv - np.outer(projected, projected) / (1.0 + context @ projected)
        self.b[arm] += reward * context


class ContextualBanditEnv(BanditEnv):
    """
    ## Description
    A linear contextual bandit: every step shows a context vector x; arm a pays ``theta_a . x`` plus
    Gaussian noise, where the hidden weights ``theta`` (one vector per arm) are drawn per episode from the
    seed. The best arm changes with the context, so the agent must learn how context maps to reward.

    ## Observation
    The step number, the arm labels, the current context (``d`` numbers with two decimals) and the history:
    ``history="full"`` lists every past ``context -> arm: reward``; ``"summary"`` gives the pulls and mean
    reward of each arm. After a pull the observation starts with the pull's result.

    ## Action
    The chosen label inside ``<action></action>``, e.g. ``<action>B</action>``. Invalid turns get a
    corrective message, a random arm is pulled and the penalty applies.

    ## Rewards
    ``reward_mode="raw"``: the sampled reward. ``"strategic"``: ``(mu_a - mu_min) / (mu* - mu_min)`` under
    the current context. ``"algorithmic"``: 1 if the arm is one LinUCB (alpha = ``linucb_alpha``) would pull
    given the same history. Invalid turns add ``-invalid_action_penalty``. ``info["metrics"]`` as in
    MultiArmedBandit-v0, with regret measured against the per-step optimal arm.

    ## Episode End
    Terminated after ``horizon`` turns.

    ## Arguments
    - ``num_arms`` (4), ``context_dim`` (3), ``horizon`` (50), ``noise`` (0.1, reward noise std),
      ``history`` ("full"), ``reward_mode`` ("raw"), ``invalid_action_penalty`` (1.0), ``linucb_alpha`` (1.0).

    ## Version History
    - v0: initial release.
    """

    env_name = "ContextualBandit"

    def __init__(
        self,
        num_arms: int = 4,
        context_dim: int = 3,
        horizon: int = 50,
        noise: float = 0.1,
        history: str = "full",
        reward_mode: str = "raw",
        invalid_action_penalty: float = 1.0,
        linucb_alpha: float = 1.0,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(
            num_arms=num_arms,
            horizon=horizon,
            history=history,
            reward_mode=reward_mode,
            invalid_action_penalty=invalid_action_penalty,
            render_mode=render_mode,
        )
        if not 1 <= context_dim <= 16:
            raise ValueError(f"context_dim must be in 1..16, got {context_dim}")
        if noise < 0:
            raise ValueError(f"noise must be >= 0, got {noise}")
        self.context_dim = context_dim
        self.noise = float(noise)
        self.linucb_alpha = linucb_alpha

    def _draw_context(self) -> np.ndarray:
        # Rounded to what the observation shows, so text-only agents see the exact context.
        return np.round(self.np_random.uniform(-1.0, 1.0, self.context_dim), 2)

    def _draw_instance(self, options: dict[str, Any]) -> str:
        self.theta = self.np_random.normal(0.0, 1.0, (self.num_arms, self.context_dim))
        self.context = self._draw_context()
        self._reference = LinUCB(self.num_arms, self.context_dim, self.linucb_alpha)
        self._history: list[str] = []
        digest = hashlib.sha1(np.round(self.theta, 6).tobytes() + f"{self.horizon}".encode()).hexdigest()[:12]
        return f"{self.env_name}-{digest}"

    def _arm_means(self) -> np.ndarray:
        return self.theta @ self.context

    def _sample_reward(self, arm: int) -> float:
        return float(self.theta[arm] @ self.context + self.np_random.normal(0.0, self.noise))

    def _reference_arms(self) -> np.ndarray:
        return self._reference.choices(self.context)

    def _record(self, arm: int, reward: float) -> None:
        if self.reward_mode == "algorithmic":
            self._reference.update(arm, self.context, reward)
        if self.history == "full":
            self._history.append(f"{format_vector(self.context)} -> {self.labels[arm]}: {reward:.3f}")

    def _advance(self) -> None:
        self.context = self._draw_context()

    def _system_prompt(self) -> str:
        return (
            f"You are playing a contextual bandit game with {self.num_arms} arms labeled {', '.join(self.labels)}. "
            f"Each turn you see a context of {self.context_dim} numbers. Each arm's expected reward is a fixed, "
            "unknown linear function of the context, plus noise, so the best arm depends on the context. "
            f"You have {self.horizon} pulls; maximise the total reward. Answer with one arm label inside "
            f"<action></action>, for example <action>{self.labels[0]}</action>."
        )

    def _observation(self, feedback: str) -> str:
        pulls = int(self.counts.sum())
        lines = [feedback] if feedback else []
        lines.append(f"Pull {pulls + 1} of {self.horizon}. Arms: {', '.join(self.labels)}.")
        if self.history == "full":
            lines.append("History (context -> arm: reward):")
            lines.extend(self._history or ["none yet"])
        else:
            for label, count, total in zip(self.labels, self.counts, self.sums):
                lines.append(f"{label}: {count} pulls, mean reward {total / count:.3f}" if count else f"{label}: 0 pulls")
        lines.append(f"Current context: {format_vector(self.context)}")
        lines.append("Which arm do you pull next?")
        return "\n".join(lines)
