"""Several attempts at one task: ``TryAgain`` (UFO, unary feedback) and ``MultiAttempt`` (research protocols §4).

Both wrap any env with a verifiable final answer. The protocol such an env follows:

- it ends its episode (``terminated=True``) on the step where the agent gives its final answer;
- it reports whether the answer is right on that step, as ``info["correct"]`` (bool) or as
  ``info["metrics"]["correct"]`` (1.0 or 0.0, what Search-v0 and ToolCalls-v0 report); an env that reports
  neither is judged by its terminal reward (right when ``reward > success_threshold``, default 0);
- optionally ``info["answer"]``, the answer it extracted (else the last ``<answer>`` tag, else the action),
  used to count repeated answers;
- ``reset`` with the same seed and options gives the same task (DESIGN.md §2).

An attempt is one inner episode: after a wrong answer (or an attempt that ran out of turns without one)
the inner env is reset to the same task and the agent is told, in a new user message, to try again.
Inner rewards are not passed on: the wrapper's reward is the protocol's (the inner step's reward
components and metrics stay visible as ``info["inner_reward_components"]`` and in ``metrics``).
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from rl_llm.envs.parsing import extract_tag


def normalise_answer(answer: str) -> str:
    return " ".join(answer.split()).lower()


def reported_correct(info: dict[str, Any]) -> bool | None:
    """Whether the env says the final answer is right: ``info["correct"]`` (a bool), else
    ``info["metrics"]["correct"]``; None when it says neither (the caller then judges by the reward)."""
    correct = info.get("correct")
    if isinstance(correct, (bool, np.bool_)):
        return bool(correct)
    metrics = info.get("metrics") or {}
    return bool(metrics["correct"]) if "correct" in metrics else None


class _Attempts(gym.Wrapper[str, str, str, str]):
    """Shared mechanics: attempt counting, re-resetting to the same task, answer bookkeeping."""

    def __init__(self, env: gym.Env, max_attempts: int, success_threshold: float) -> None:
        super().__init__(env)
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.max_attempts = max_attempts
        self.success_threshold = success_threshold
        self.max_turns = max_attempts * getattr(env.unwrapped, "max_turns", 1)
        self._rng = np.random.default_rng()
        self._over = True
        self._attempt_transcripts: list[str] = []

    # -- subclass hooks -------------------------------------------------------------------------------------
    def _attempt_budget(self) -> int:
        return self.max_attempts

    def _on_reset(self, info: dict[str, Any]) -> None:
        """Adjust the reset info (system prompt) for this episode."""

    def _feedback(self) -> str:
        raise NotImplementedError

    def _final_rewards(self, correct: bool) -> dict[str, float]:
        """Reward components of the step that ends the episode."""
        raise NotImplementedError

    # -- Gymnasium API --------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
            self._task_seed = seed
        else:
            self._task_seed = int(self._rng.integers(2**31))
        self._options = options
        observation, info = self.env.reset(seed=self._task_seed, options=options)
        self._attempt = 0
        self._turn = 0
        self._answers: list[str] = []
        self._attempt_transcripts = []
        self._over = False
        info = dict(info)
        self._on_reset(info)
        return observation, info

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        if self._over:
            raise RuntimeError(f"{type(self).__name__}: the episode has ended (or never started); call reset()")
        observation, reward, terminated, truncated, info = self.env.step(action)
        self._turn += 1
        info = dict(info)
        info["inner_reward_components"] = info.get("reward_components", {})
        rewards = self._step_rewards(info)
        if not (terminated or truncated):
            return self._result(observation, rewards, False, False, info)
        correct = self._judge(action, float(reward), terminated, info)
        self._attempt += 1
        if correct or self._attempt >= self._attempt_budget():
            self._over = True
            rewards.update(self._final_rewards(correct))
            terminated = correct or self._ends_by_termination
            return self._result("", rewards, terminated, not terminated, info, correct)
        self._attempt_transcripts.append(self.env.unwrapped.transcript)
        self.env.reset(seed=self._task_seed, options=self._options)
        return self._result(self._feedback(), rewards, False, False, info)

    # -- helpers -------------------------------------------------------------------------------------------
    _ends_by_termination = False

    def _step_rewards(self, info: dict[str, Any]) -> dict[str, float]:
        return {}

    def _judge(self, action: str, reward: float, terminated: bool, info: dict[str, Any]) -> bool:
        if not terminated:  # the attempt ran out of turns without a final answer
            return False
        answer = info.get("answer")
        if not isinstance(answer, str):
            answer = extract_tag(action, "answer", last=True) or action
        self._answers.append(normalise_answer(answer))
        correct = reported_correct(info)
        return correct if correct is not None else reward > self.success_threshold

    def _result(
        self, observation: str, rewards: dict[str, float], terminated: bool, truncated: bool, info: dict[str, Any],
        success: bool = False,
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        info["reward_components"] = rewards
        info["metrics"] = {**info.get("metrics", {}), **self._metrics(success)}
        info["attempt"] = self._attempt
        info["turn"] = self._turn
        info.setdefault("invalid_action", False)
        return observation, float(sum(rewards.values())), terminated, truncated, info

    def _metrics(self, success: bool) -> dict[str, float]:
        answered = len(self._answers)
        return {
            "attempts": float(self._attempt),
            "success": float(success),
            "answers": float(answered),
            "distinct_answer_fraction": len(set(self._answers)) / answered if answered else 1.0,
        }

    def render(self) -> str | None:
        return self.transcript

    @property
    def transcript(self) -> str:
        """Every attempt's transcript, in order (the inner env keeps only the current attempt's)."""
        return "\n\n".join([*self._attempt_transcripts, self.env.unwrapped.transcript])


class TryAgain(_Attempts):
    """
    ## Description
    UFO (Unary Feedback as Observation): after a wrong answer the agent only hears ``feedback``
    ("Incorrect. Please think again.") and answers the same task again, up to ``max_attempts`` times.

    ## Rewards
    ``success``: ``gamma ** t`` when the answer at attempt ``t`` (0-based) is right (UFO: gamma = 0.5,
    i.e. 1/2^t). ``repetition_penalty``: at the end, ``-repetition_lambda * (1 - E / T)`` with ``T`` the
    answers given and ``E`` the distinct ones (whitespace-normalised, lower-cased). ``format``:
    ``-format_penalty`` on every step the inner env flags as an invalid action (RAGEN uses 0.1).
    Metrics: ``attempts``, ``success``, ``answers``, ``distinct_answer_fraction`` and the inner env's.

    ## Episode End
    Terminated on a right answer; truncated when ``max_attempts`` attempts were all wrong.

    ## Arguments
    ``max_attempts`` (5), ``gamma`` (0.5), ``repetition_lambda`` (0.5), ``format_penalty`` (0.0),
    ``feedback``, ``success_threshold`` (0.0, used when the env reports no verdict, see the module docstring).
    """

    def __init__(
        self,
        env: gym.Env,
        max_attempts: int = 5,
        gamma: float = 0.5,
        repetition_lambda: float = 0.5,
        format_penalty: float = 0.0,
        feedback: str = "Incorrect. Please think again.",
        success_threshold: float = 0.0,
    ) -> None:
        super().__init__(env, max_attempts, success_threshold)
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        self.gamma = gamma
        self.repetition_lambda = repetition_lambda
        self.format_penalty = format_penalty
        self.feedback = feedback

    def _feedback(self) -> str:
        return self.feedback

    def _step_rewards(self, info: dict[str, Any]) -> dict[str, float]:
        return {"format": -self.format_penalty} if self.format_penalty and info.get("invalid_action") else {}

    def _final_rewards(self, correct: bool) -> dict[str, float]:
        answered = len(self._answers)
        distinct = len(set(self._answers))
        penalty = self.repetition_lambda * (1.0 - distinct / answered) if answered else 0.0
        success = self.gamma ** (self._attempt - 1) if correct else 0.0
        return {"success": success, "repetition_penalty": -penalty}


class MultiAttempt(_Attempts):
    """
    ## Description
    Multi-attempt RL: the agent is told it has ``N`` attempts (``N`` drawn uniformly from
    ``1..max_attempts`` per episode, or fixed with ``attempts=N``). After a wrong answer it hears "Your
    answer is incorrect. You have K attempts left. Try an alternative." and tries again.

    ## Rewards
    At the end only: ``+discount ** t`` for a right answer at attempt ``t`` (0-based; discount 1.0 = none),
    ``-0.5`` when every answer given was wrong, ``-1.0`` when no final answer was given at all.

    ## Episode End
    Terminated on a right answer or when the ``N`` attempts are used up.

    ## Arguments
    ``max_attempts`` (5), ``attempts`` (None: random per episode), ``discount`` (1.0),
    ``wrong_answer_reward`` (-0.5), ``no_answer_reward`` (-1.0), ``success_threshold`` (0.0).
    """

    _ends_by_termination = True

    def __init__(
        self,
        env: gym.Env,
        max_attempts: int = 5,
        attempts: int | None = None,
        discount: float = 1.0,
        wrong_answer_reward: float = -0.5,
        no_answer_reward: float = -1.0,
        success_threshold: float = 0.0,
    ) -> None:
        super().__init__(env, max_attempts if attempts is None else attempts, success_threshold)
        if attempts is not None and attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {attempts}")
        self.fixed_attempts = attempts
        self.discount = discount
        self.wrong_answer_reward = wrong_answer_reward
        self.no_answer_reward = no_answer_reward
        self._budget = self.max_attempts

    def _attempt_budget(self) -> int:
        return self._budget

    def _on_reset(self, info: dict[str, Any]) -> None:
        self._budget = self.fixed_attempts or int(self._rng.integers(1, self.max_attempts + 1))
        plural = "attempt" if self._budget == 1 else "attempts"
        note = f"You have {self._budget} {plural} to answer the question."
        info["system_prompt"] = f"{info.get('system_prompt', '')}\n\n{note}".lstrip()
        info["attempts"] = self._budget

    def _feedback(self) -> str:
        left = self._budget - self._attempt
        return f"Your answer is incorrect. You have {left} {'attempt' if left == 1 else 'attempts'} left. Try an alternative."

    def _final_rewards(self, correct: bool) -> dict[str, float]:
        if correct:
            return {"outcome": self.discount ** (self._attempt - 1)}
        return {"outcome": self.wrong_answer_reward if self._answers else self.no_answer_reward}

