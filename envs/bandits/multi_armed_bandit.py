"""Multi-armed bandit played through text."""

from __future__ import annotations

from typing import Any

import numpy as np

from rl_llm import checks
from rl_llm.envs.bandits.base import BanditEnv, ucb1_choice

DISTRIBUTIONS = ("bernoulli", "gaussian")


class MultiArmedBanditEnv(BanditEnv):
    """
    ## Description
    A K-armed bandit (Bernoulli or Gaussian arms) presented as text, after BanditBench and
    "LLMs are Greedy Agents". The agent has ``horizon`` pulls and must trade exploration for exploitation.
    Arm means are drawn per episode from the seed (or given), so every reset is a new bandit instance.

    ## Observation
    The step number, the arm labels (``A``, ``B``, ...) and the history so far: in ``history="summary"``
    form the pulls and mean reward of each arm, in ``history="full"`` form the list of ``arm: reward``
    pairs. After a pull the observation starts with the pull's result.

    ## Action
    One LLM turn containing the chosen label inside ``<action></action>``, e.g. ``<action>C</action>``
    (``Arm C`` and lower case also work; with several tags the last one counts). Anything else is invalid:
    the turn gets a corrective message, a random arm is pulled for the agent and the penalty applies.

    ## Rewards
    ``reward_mode="raw"``: the sampled reward of the pulled arm. ``"strategic"`` (regret-shaped):
    ``(mu_a - mu_min) / (mu* - mu_min)`` in [0, 1]. ``"algorithmic"``: 1 if the arm is one UCB1 would pull
    given the same history, else 0. Invalid turns add ``-invalid_action_penalty``.
    ``info["metrics"]``: cumulative ``regret`` (sum of mu* - mu_a), ``arms_untried_frac``, ``greedy_share``
    (choices of an arm with the best empirical mean), ``best_arm_share``, ``invalid_actions``.

    ## Episode End
    Terminated after ``horizon`` turns (each turn is one pull). ``max_turns`` equals ``horizon``.

    ## Arguments
    - ``num_arms`` (5): 2..26 arms.
    - ``horizon`` (50): pulls per episode.
    - ``distribution`` ("bernoulli"): ``"bernoulli"`` or ``"gaussian"``.
    - ``gap`` (None): Bernoulli only; best arm ``0.5 + gap/2``, the others ``0.5 - gap/2`` (BanditBench uses
      0.2 and 0.5). None draws every mean uniformly from [0, 1].
    - ``sigma`` (1.0): Gaussian only; means ~ N(0, sigma), reward noise std sigma.
    - ``means`` (None): fixed arm means (overrides the draw); also ``reset(options={"means": [...]})``.
    - ``history`` ("summary"), ``reward_mode`` ("raw"), ``invalid_action_penalty`` (1.0), ``ucb_c`` (0.5, the
      UCB1 constant of the algorithmic reward; see ``rl_llm.agents.baselines.bandits.UCB1``).

    ## Version History
    - v0: initial release.
    """

    reset_options = frozenset({"means"})

    env_name = "MultiArmedBandit"

    def __init__(
        self,
        num_arms: int = 5,
        horizon: int = 50,
        distribution: str = "bernoulli",
        gap: float | None = None,
        sigma: float = 1.0,
        means: list[float] | None = None,
        history: str = "summary",
        reward_mode: str = "raw",
        invalid_action_penalty: float = 1.0,
        ucb_c: float = 0.5,
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
        if distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")
        if gap is not None:
            gap = checks.real("gap", gap, positive=True, maximum=1.0)
            if distribution != "bernoulli":
                raise ValueError("gap needs distribution='bernoulli'")
        self.distribution = distribution
        self.gap = gap
        self.sigma = checks.real("sigma", sigma, positive=True, maximum=checks.MAX_REWARD)
        self.fixed_means = None if means is None else self._check_means(means)
        self.ucb_c = checks.real("ucb_c", ucb_c, minimum=0.0)

    def _check_means(self, means: Any) -> np.ndarray:
        try:
            array = np.asarray(means, dtype=np.float64)
        except (TypeError, ValueError):  # strings, nested lists of uneven length, dicts
            raise ValueError(f"means must be a list of {self.num_arms} numbers, got {means!r}"[:300]) from None
        if array.shape != (self.num_arms,):
            raise ValueError(f"means must have {self.num_arms} entries, got shape {array.shape}")
        if not (np.abs(array) <= checks.MAX_REWARD).all():  # NaN too; near 1e308, best - worst overflowed
            raise ValueError(f"means must be finite numbers in [-{checks.MAX_REWARD:g}, {checks.MAX_REWARD:g}], "
                             f"got {array.tolist()}")
        if self.distribution == "bernoulli" and not ((array >= 0) & (array <= 1)).all():
            raise ValueError("Bernoulli means must lie in [0, 1]")
        return array

    def _draw_instance(self, options: dict[str, Any]) -> str:
        if "means" in options:
            self.means = self._check_means(options["means"])
        elif self.fixed_means is not None:
            self.means = self.fixed_means.copy()
        elif self.distribution == "gaussian":
            self.means = self.np_random.normal(0.0, self.sigma, self.num_arms)
        elif self.gap is not None:
            self.means = np.full(self.num_arms, 0.5 - self.gap / 2)
            self.means[self.np_random.integers(self.num_arms)] = 0.5 + self.gap / 2
        else:
            self.means = self.np_random.uniform(0.0, 1.0, self.num_arms)
        self._means = self.means.tolist()
        self._history: list[str] = []
        return f"{self.env_name}-{self.distribution}-{self._instance_digest(self.means)}"

    def _arm_means(self) -> list[float]:
        return self._means

    def _sample_reward(self, arm: int) -> float:
        if self.distribution == "bernoulli":
            return float(self.np_random.random() < self._means[arm])
        return self._means[arm] + self.sigma * float(self.np_random.standard_normal())

    def _reference_arms(self) -> np.ndarray:
        return ucb1_choice(self.counts, self.sums, self.ucb_c)

    def _record(self, arm: int, reward: float) -> None:
        if self.history == "full":
            self._history.append(f"{self.labels[arm]}: {self._format_reward(reward)}")

    def _format_reward(self, reward: float) -> str:
        return f"{int(reward)}" if self.distribution == "bernoulli" else f"{reward:.3f}"

    def _system_prompt(self) -> str:
        kind = "either 0 or 1" if self.distribution == "bernoulli" else "a real number"
        return (
            f"You are playing a multi-armed bandit game with {self.num_arms} arms labeled "
            f"{self._label_list}. Each arm pays a random reward ({kind}) from its own fixed distribution, "
            f"unknown to you. You have {self.horizon} pulls in total; maximise the total reward. "
            "Each turn, choose one arm and answer with its label inside <action></action>, "
            f"for example <action>{self.labels[0]}</action>."
        )

    def _observation(self, feedback: str) -> str:
        lines = [feedback] if feedback else []
        lines.append(f"Pull {self.pulls + 1} of {self.horizon}. Arms: {self._label_list}.")
        if self.history == "full":
            lines.append("History (arm: reward): " + (", ".join(self._history) if self._history else "none yet"))
        else:
            lines.extend(self._arm_summary_lines())
        lines.append("Which arm do you pull next?")
        return "\n".join(lines)
