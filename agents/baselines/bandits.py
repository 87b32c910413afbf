"""Classical bandit algorithms acting through the bandit environments' text interface.

Each baseline recovers what it needs from the observation text alone: the multi-armed observation holds
the per-arm sufficient statistics (pulls and mean reward, or the full list), and the contextual agent
replays the conversation's ``Current context`` / ``Arm X gave reward r`` lines.
"""

from __future__ import annotations

import re

import numpy as np

from rl_llm.agents.policy import TextPolicy, last_user_message, system_message
from rl_llm.checks import real
from rl_llm.envs.bandits.base import ARM_LABELS, ucb1_choice
from rl_llm.envs.bandits.contextual_bandit import LinUCB
from rl_llm.types import Message

_ARMS = re.compile(r"Arms: ([A-Z](?:, [A-Z])*)\.")
_SUMMARY = re.compile(r"^([A-Z]): (\d+) pulls?(?:, mean reward (-?[\d.]+))?$", re.MULTILINE)
_FULL = re.compile(r"History \(arm: reward\): (.*)$", re.MULTILINE)
_PAIR = re.compile(r"([A-Z]): (-?[\d.]+)")
_FEEDBACK = re.compile(r"Arm ([A-Z]) gave reward (-?[\d.]+)\.")
_CONTEXT = re.compile(r"Current context: \[([^\]]*)\]")


def _num_arms(observation: str) -> int:
    """The number of arms an observation lists; a ValueError naming the missing line when it lists none."""
    arms = _ARMS.search(observation)
    if arms is None:
        raise ValueError("not a bandit observation: no 'Arms: ...' line")
    return len(arms[1].split(", "))


def bandit_statistics(observation: str) -> tuple[np.ndarray, np.ndarray]:
    """(pulls, reward sums) per arm, parsed from a MultiArmedBandit observation in either history form."""
    num_arms = _num_arms(observation)
    counts, sums = np.zeros(num_arms), np.zeros(num_arms)
    full = _FULL.search(observation)
    if full is not None:
        for label, reward in _PAIR.findall(full[1]):
            arm = ARM_LABELS.index(label)
            counts[arm] += 1
            sums[arm] += float(reward)
        return counts, sums
    for label, count, mean in _SUMMARY.findall(observation):
        arm = ARM_LABELS.index(label)
        counts[arm] = int(count)
        sums[arm] = int(count) * float(mean) if mean else 0.0
    return counts, sums


def action(arm: int) -> str:
    return f"<action>{ARM_LABELS[arm]}</action>"


class BanditPolicy(TextPolicy):
    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    def respond(self, conversation: list[Message]) -> str:
        counts, sums = bandit_statistics(last_user_message(conversation))
        return action(self.choose(counts, sums, system_message(conversation)))

    def choose(self, counts: np.ndarray, sums: np.ndarray, system_prompt: str) -> int:
        raise NotImplementedError

    def pick(self, candidates: np.ndarray) -> int:
        return int(candidates[self.rng.integers(len(candidates))])


class RandomArm(BanditPolicy):
    name = "random"

    def choose(self, counts: np.ndarray, sums: np.ndarray, system_prompt: str) -> int:
        return int(self.rng.integers(len(counts)))


class EpsilonGreedy(BanditPolicy):
    name = "epsilon_greedy"

    def __init__(self, epsilon: float = 0.1, seed: int | None = None) -> None:
        super().__init__(seed)
        self.epsilon = real("epsilon", epsilon, minimum=0.0, maximum=1.0)  # a probability: NaN never explored

    def choose(self, counts: np.ndarray, sums: np.ndarray, system_prompt: str) -> int:
        untried = np.flatnonzero(counts == 0)
        if untried.size == len(counts) or self.rng.random() < self.epsilon:
            return int(self.rng.integers(len(counts)))
        means = np.where(counts > 0, sums / np.maximum(counts, 1), -np.inf)
        return self.pick(np.flatnonzero(means >= means.max() - 1e-12))


class UCB1(BanditPolicy):
    """UCB1 with bonus ``c * sqrt(2 ln t / n)``. The default c = 0.5 gives ``sqrt(ln t / (2 n))``, the
    Hoeffding radius for rewards in [0, 1] at confidence 1/t; c = 1 is Auer et al.'s looser constant."""

    name = "ucb"

    def __init__(self, c: float = 0.5, seed: int | None = None) -> None:
        super().__init__(seed)
        self.c = real("c", c, minimum=0.0)  # a NaN bonus made every arm's score NaN

    def choose(self, counts: np.ndarray, sums: np.ndarray, system_prompt: str) -> int:
        return self.pick(ucb1_choice(counts, sums, self.c))


class ThompsonSampling(BanditPolicy):
    """Beta(1, 1) priors for 0/1 rewards; for real rewards a Gaussian posterior N(mean, 1/(n+1))."""

    name = "thompson"

    def choose(self, counts: np.ndarray, sums: np.ndarray, system_prompt: str) -> int:
        if "either 0 or 1" in system_prompt:
            successes = np.round(sums)
            samples = self.rng.beta(1 + successes, 1 + counts - successes)
        else:
            samples = self.rng.normal(sums / (counts + 1), 1 / np.sqrt(counts + 1))
        return int(np.argmax(samples))


def _vector(text: str) -> np.ndarray:
    return np.array([float(value) for value in text.split(",")])


class LinUCBAgent(TextPolicy):
    """Disjoint LinUCB over the contextual bandit's conversation."""

    name = "linucb"

    def __init__(self, alpha: float = 1.0, seed: int | None = None) -> None:
        self.alpha = real("alpha", alpha, minimum=0.0)  # a NaN bonus made every arm's score NaN
        self.rng = np.random.default_rng(seed)

    def respond(self, conversation: list[Message]) -> str:
        model: LinUCB | None = None
        context: np.ndarray | None = None
        for message in conversation:
            if message.role != "user":
                continue
            feedback = _FEEDBACK.search(message.content)
            if feedback is not None and context is not None and model is not None:
                model.update(ARM_LABELS.index(feedback[1]), context, float(feedback[2]))
            current = _CONTEXT.search(message.content)
            if current is not None:
                context = _vector(current[1])
                if model is None:
                    model = LinUCB(_num_arms(message.content), len(context), self.alpha)
        if model is None or context is None:
            raise ValueError("not a contextual bandit conversation: no 'Current context' line")
        choices = model.choices(context)
        return action(int(choices[self.rng.integers(len(choices))]))


class RandomContextualArm(TextPolicy):
    name = "random"

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    def respond(self, conversation: list[Message]) -> str:
        return action(int(self.rng.integers(_num_arms(last_user_message(conversation)))))
