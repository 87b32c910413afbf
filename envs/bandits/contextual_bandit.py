"""Contextual (linear) bandit played through text."""

from __future__ import annotations

from typing import Any

import numpy as np

from rl_llm import checks
from rl_llm.envs.bandits.base import BanditEnv

MAX_HORIZON = 100_000  # contexts and noise for the whole episode are drawn at reset


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
    - ``num_arms`` (4), ``context_dim`` (3, at most 16), ``horizon`` (50, at most 100,000: the episode's contexts
      are drawn at reset), ``noise`` (0.1, reward noise std),
      ``history`` ("full"), ``reward_mode`` ("raw"), ``invalid_action_penalty`` (1.0), ``linucb_alpha`` (1.0).

    ## Version History
    - v0: initial release.
    """

    reset_options = frozenset()

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
        self.context_dim = checks.integer("context_dim", context_dim, minimum=1, maximum=16)
        # The episode's contexts and noise are drawn at reset (see _draw_instance): a horizon of 10**9 would
        # ask for tens of gigabytes there, so it is bounded here, far past any LLM episode.
        checks.integer("horizon", horizon, minimum=1, maximum=MAX_HORIZON)
        self.noise = checks.reward("noise", noise, minimum=0.0)
        self.linucb_alpha = checks.real("linucb_alpha", linucb_alpha, minimum=0.0)

    def _draw_instance(self, options: dict[str, Any]) -> str:
        self.theta = self.np_random.normal(0.0, 1.0, (self.num_arms, self.context_dim))
        # The whole episode's contexts and noise are drawn up front, so a step is list indexing only.
        # Contexts are rounded to what the observation shows: text-only agents see the exact context.
        self._contexts = np.round(self.np_random.uniform(-1.0, 1.0, (self.horizon, self.context_dim)), 2)
        self._means_per_step = (self._contexts @ self.theta.T).tolist()
        self._noise = (self.noise * self.np_random.standard_normal(self.horizon)).tolist()
        self._context_texts = [format_vector(context) for context in self._contexts]
        self._reference = LinUCB(self.num_arms, self.context_dim, self.linucb_alpha)
        self._history: list[str] = []
        return f"{self.env_name}-{self._instance_digest(self.theta)}"

    @property
    def context(self) -> np.ndarray:
        """The context of the current step."""
        return self._contexts[min(self.pulls, self.horizon - 1)]

    def _arm_means(self) -> list[float]:
        return self._means_per_step[self.pulls]

    def _sample_reward(self, arm: int) -> float:
        return self._means_per_step[self.pulls][arm] + self._noise[self.pulls]

    def _reference_arms(self) -> np.ndarray:
        return self._reference.choices(self.context)

    def _record(self, arm: int, reward: float) -> None:
        step = self.pulls - 1  # called after the pull was counted
        if self.reward_mode == "algorithmic":
            self._reference.update(arm, self._contexts[step], reward)
        if self.history == "full":
            self._history.append(f"{self._context_texts[step]} -> {self.labels[arm]}: {reward:.3f}")

    def _system_prompt(self) -> str:
        return (
            f"You are playing a contextual bandit game with {self.num_arms} arms labeled {self._label_list}. "
            f"Each turn you see a context of {self.context_dim} numbers. Each arm's expected reward is a fixed, "
            "unknown linear function of the context, plus noise, so the best arm depends on the context. "
            f"You have {self.horizon} pulls; maximise the total reward. Answer with one arm label inside "
            f"<action></action>, for example <action>{self.labels[0]}</action>."
        )

    def _observation(self, feedback: str) -> str:
        lines = [feedback] if feedback else []
        lines.append(f"Pull {self.pulls + 1} of {self.horizon}. Arms: {self._label_list}.")
        if self.history == "full":
            lines.append("History (context -> arm: reward):")
            lines.extend(self._history or ["none yet"])
        else:
            lines.extend(self._arm_summary_lines())
        lines.append(f"Current context: {self._context_texts[self.pulls]}")
        lines.append("Which arm do you pull next?")
        return "\n".join(lines)
