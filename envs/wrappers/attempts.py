"""Several attempts at one task: ``TryAgain`` (UFO, unary feedback) and ``MultiAttempt``
(docs/research-protocols.md#try-again-and-multi-attempt).

Both wrap any env with a verifiable final answer. The protocol such an env follows:

- it ends its episode (``terminated=True``) on the step where the agent gives its final answer;
- it reports whether the answer is right on that step, as ``info["correct"]`` (bool) or as
  ``info["metrics"]["correct"]`` (1.0 or 0.0, what Search-v0 and ToolCalls-v0 report); an env that reports
  neither is judged by its terminal reward (right when ``reward > success_threshold``, default 0);
- optionally ``info["answer"]``, the answer it extracted (else the last ``<answer>`` tag, else the action),
  used to count repeated answers;
- ``reset`` with the same seed and options gives the same task (docs/design.md#the-environment-contract).

An attempt is one inner episode: after a wrong answer (or an attempt that ran out of turns without one)
the inner env is reset to the same task and the agent is told, in a new user message, to try again; the
message then says the task starts again and re-shows the new attempt's first observation (TicTacToe as O:
the board with the opponent's opening move; Terminal: the fresh workspace), unless ``restate_task=False``.
Repeated answers are compared after the normalisation exact match uses (``Paris``, ``Paris.`` and
``paris!`` are one answer; numbers compare by value, so ``-4`` and ``4`` stay apart).
Inner rewards are not passed on: the wrapper's reward is the protocol's (the inner step's reward
components and metrics stay visible as ``info["inner_reward_components"]`` and in ``metrics``).
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from rl_llm import checks
from rl_llm.envs.base import print_text, reported_correct
from rl_llm.envs.parsing import extract_tag
from rl_llm.envs.qa_scoring import normalize_answer, parse_number

RESTART_NOTE = "New attempt: the task starts again from the beginning (everything was reset)."


def normalise_answer(answer: str) -> str:
    """An answer as the repetition count sees it: a number by its value, anything else as exact match
    normalises it (lower case, no punctuation or articles, squeezed whitespace)."""
    number = parse_number(answer)
    return format(number, ".15g") if number is not None else normalize_answer(answer)


class _Attempts(gym.Wrapper[str, str, str, str], gym.utils.RecordConstructorArgs):
    """Shared mechanics: attempt counting, re-resetting to the same task, answer bookkeeping.

    A subclass records its own arguments first (``RecordConstructorArgs``), so ``gym.make(env.spec)`` rebuilds
    it; the first recording is the one kept."""

    def __init__(self, env: gym.Env, max_attempts: int, success_threshold: float, restate_task: bool) -> None:
        gym.Wrapper.__init__(self, env)
        # Checked here, not at the first reset: 2.5 attempts made max_turns a float, NaN compared False
        self.max_attempts = checks.integer("max_attempts", max_attempts, minimum=1)
        self.success_threshold = checks.reward("success_threshold", success_threshold)
        self.restate_task = checks.flag("restate_task", restate_task)
        self.max_turns = max_attempts * getattr(env.unwrapped, "max_turns", 1)
        self._rng = np.random.default_rng()
        self._over = True
        self._transcript_head = ""  # the system prompt and first observation the agent saw
        self._attempt_log: list[str] = []  # finished attempts' turns, each followed by the feedback shown
        self._inner_head = ""  # how the inner transcript of the current attempt starts (dropped when rendering)

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
        rng = np.random.default_rng(seed) if seed is not None else self._rng
        task_seed = seed if seed is not None else int(rng.integers(2**31))
        # The inner env first: a reset it refuses (a bad option) leaves this episode's task, and so its next
        # attempts, as they were.
        observation, info = self.env.reset(seed=task_seed, options=options)
        self._rng, self._task_seed, self._options = rng, task_seed, options
        self._attempt = 0
        self._turn = 0
        self._answers: list[str] = []
        self._attempt_log = []
        self._over = False
        info = dict(info)
        self._inner_head = self._head(info.get("system_prompt", ""), observation)
        self._on_reset(info)
        self._transcript_head = self._head(info.get("system_prompt", ""), observation)
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
        finished = self._attempt_body()
        first, inner_info = self.env.reset(seed=self._task_seed, options=self._options)
        self._inner_head = self._head(inner_info.get("system_prompt", ""), first)
        message = self._feedback()
        if self.restate_task:
            message = f"{message}\n\n{RESTART_NOTE}\n\n{first}"
        self._attempt_log += [finished, f"[user]\n{message}"]
        if self.render_mode == "human":  # the inner env printed its own steps and reset, not this message
            print_text(f"[user]\n{message}")
        return self._result(message, rewards, False, False, info)

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
        """The transcript (``transcript``) as a string; None in ``"human"`` mode, where every step was already
        printed (Gymnasium's render contract, as ``TextEnv.render``; this returned the text in both modes)."""
        if self.render_mode == "human":
            return None
        return self.transcript

    @property
    def transcript(self) -> str:
        """What the agent saw, in order: the system prompt and first observation, every attempt's turns and,
        after each wrong attempt, the feedback message (the inner env keeps only the current attempt's)."""
        return "\n\n".join(part for part in (self._transcript_head, *self._attempt_log, self._attempt_body()) if part)

    @staticmethod
    def _head(system_prompt: str, observation: str) -> str:
        return f"[system]\n{system_prompt}\n\n[user]\n{observation}"

    def _attempt_body(self) -> str:
        """The current attempt's turns from the inner transcript, without the system prompt and first
        observation (the wrapper shows those itself); an env with another transcript layout is kept whole."""
        inner = self.env.unwrapped.transcript
        if inner.startswith(self._inner_head):
            return inner[len(self._inner_head) :].lstrip("\n")
        return inner


class TryAgain(_Attempts):
    """
    ## Description
    UFO (Unary Feedback as Observation): after a wrong answer the agent only hears ``feedback``
    ("Incorrect. Please think again.") and answers the same task again, up to ``max_attempts`` times. The
    feedback message also re-shows the new attempt's first observation, saying the task starts again
    (``restate_task=False``: the feedback alone, UFO's exact message, for single-turn QA envs).

    ## Rewards
    ``success``: ``gamma ** t`` when the answer at attempt ``t`` (0-based) is right (UFO: gamma = 0.5,
    i.e. 1/2^t). ``repetition_penalty``: at the end, ``-repetition_lambda * (1 - E / T)`` with ``T`` the
    answers given and ``E`` the distinct ones (normalised as exact match does, see ``normalise_answer``).
    ``format``: ``-format_penalty`` on every step the inner env flags as an invalid action (0.1, the RAGEN
    setting UFO trains with), so ``max_attempts`` turns without an answer (-0.5 with the defaults) never
    beat as many identical wrong answers (``-repetition_lambda * (1 - 1/T)``, -0.4).
    Metrics: ``attempts``, ``success``, ``answers``, ``distinct_answer_fraction`` and the inner env's.

    ## Episode End
    Terminated on a right answer; truncated when ``max_attempts`` attempts were all wrong.

    ## Arguments
    ``max_attempts`` (5), ``gamma`` (0.5), ``repetition_lambda`` (0.5), ``format_penalty`` (0.1),
    ``feedback``, ``success_threshold`` (0.0, used when the env reports no verdict, see the module docstring),
    ``restate_task`` (True).

    ## Version History
    - v0: initial release. Re-shows the first observation after a wrong answer, format penalty 0.1 by
      default, exact-match normalisation of repeated answers, feedback in ``render()``.
    """

    def __init__(
        self,
        env: gym.Env,
        max_attempts: int = 5,
        gamma: float = 0.5,
        repetition_lambda: float = 0.5,
        format_penalty: float = 0.1,
        feedback: str = "Incorrect. Please think again.",
        success_threshold: float = 0.0,
        restate_task: bool = True,
    ) -> None:
        gym.utils.RecordConstructorArgs.__init__(
            self, max_attempts=max_attempts, gamma=gamma, repetition_lambda=repetition_lambda,
            format_penalty=format_penalty, feedback=feedback, success_threshold=success_threshold,
            restate_task=restate_task,
        )  # fmt: skip
        super().__init__(env, max_attempts, success_threshold, restate_task)
        self.gamma = checks.real("gamma", gamma, positive=True, maximum=1.0)
        self.repetition_lambda = checks.reward("repetition_lambda", repetition_lambda, minimum=0.0)
        self.format_penalty = checks.reward("format_penalty", format_penalty, minimum=0.0)
        if not isinstance(feedback, str):
            raise ValueError(f"feedback must be a str, got {feedback!r}")
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
    answer is incorrect. You have K attempts left. Try an alternative." and tries again; the message also
    re-shows the new attempt's first observation (``restate_task``, as in ``TryAgain``).

    ## Rewards
    At the end only: ``+discount ** t`` for a right answer at attempt ``t`` (0-based; discount 1.0 = none),
    ``-0.5`` when every answer given was wrong, ``-1.0`` when no final answer was given at all.

    ## Episode End
    Terminated on a right answer or when the ``N`` attempts are used up.

    ## Arguments
    ``max_attempts`` (5), ``attempts`` (None: random per episode), ``discount`` (1.0),
    ``wrong_answer_reward`` (-0.5), ``no_answer_reward`` (-1.0), ``success_threshold`` (0.0),
    ``restate_task`` (True).
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
        restate_task: bool = True,
    ) -> None:
        gym.utils.RecordConstructorArgs.__init__(
            self, max_attempts=max_attempts, attempts=attempts, discount=discount,
            wrong_answer_reward=wrong_answer_reward, no_answer_reward=no_answer_reward,
            success_threshold=success_threshold, restate_task=restate_task,
        )  # fmt: skip
        attempts = None if attempts is None else checks.integer("attempts", attempts, minimum=1)
        super().__init__(env, max_attempts if attempts is None else attempts, success_threshold, restate_task)
        self.fixed_attempts = attempts
        self.discount = checks.real("discount", discount, minimum=0.0, maximum=1.0)
        self.wrong_answer_reward = checks.reward("wrong_answer_reward", wrong_answer_reward)
        self.no_answer_reward = checks.reward("no_answer_reward", no_answer_reward)
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

