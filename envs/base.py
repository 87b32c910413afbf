"""``TextEnv``: the shared skeleton of every single-agent rl-llm environment.

It owns what docs/design.md#the-environment-contract fixes for all environments, so each environment
file only holds its game: turn counting and the ``max_turns`` truncation, the info keys (``system_prompt``,
``task_id``, ``stop`` on reset; ``reward_components``, ``invalid_action``, ``metrics`` on every step), the
text transcript behind ``render()``, and a clear error when an ended episode is stepped.

A subclass implements ``_reset(options) -> Task`` and ``_step(action) -> Outcome``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from rl_llm import checks
from rl_llm.envs.spaces import UnicodeText

# Upper bound on one action or observation, in characters. Long enough for any real LLM turn; the
# environments still handle longer strings (they are parsed in linear time), this only bounds the space.
MAX_TEXT_LENGTH = 1 << 20


@dataclass(slots=True)
class Task:
    """What ``_reset`` returns: the first observation and the per-episode facts for ``info``."""

    observation: str
    task_id: str
    system_prompt: str
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Outcome:
    """What ``_step`` returns. ``rewards`` holds the already-weighted components; their sum is the reward."""

    observation: str
    rewards: dict[str, float]
    terminated: bool = False
    invalid_action: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


class TextEnv(gym.Env[str, str]):
    """Base class: a multi-turn text environment where one action is one complete LLM turn."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "human"], "render_fps": 4}
    #: Stop strings a generator should use for this env (closing tags of actions).
    stop: ClassVar[tuple[str, ...]] = ()
    #: The keys of ``reset(options=...)`` this env reads. Any other key is refused with a ValueError naming
    #: these, before the env changes state: a misspelt option (a curriculum's ``via: reset`` option among
    #: them) would otherwise be ignored without a word. None, for a subclass that does not say, passes every
    #: key through, as Gymnasium's envs do.
    reset_options: ClassVar[frozenset[str] | None] = None

    def __init__(self, *, max_turns: int, render_mode: str | None = None) -> None:
        # NaN, inf and 2.5 too: no turn count reaches the first two (an episode that never ends)
        max_turns = checks.integer("max_turns", max_turns, minimum=1)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.max_turns = max_turns
        self.render_mode = render_mode
        self.observation_space = UnicodeText(MAX_TEXT_LENGTH)
        self.action_space = UnicodeText(MAX_TEXT_LENGTH)
        self._turn = 0
        self._episode_over = True
        # (role, text) pairs, formatted only when the transcript is read: keeps step() cheap.
        self._transcript: list[tuple[str, str]] = []

    # -- the two methods a subclass writes ------------------------------------------------------------
    def _reset(self, options: dict[str, Any]) -> Task:
        raise NotImplementedError

    def _step(self, action: str) -> Outcome:
        raise NotImplementedError

    # -- Gymnasium API ----------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        if options is not None and not isinstance(options, Mapping):  # dict("x") fails with a puzzling message
            raise TypeError(f"{type(self).__name__}: reset options must be a dict, got {type(options).__name__}")
        options = dict(options or {})
        if self.reset_options is not None and not options.keys() <= self.reset_options:
            unknown = ", ".join(repr(key) for key in options if key not in self.reset_options)
            takes = ", ".join(sorted(self.reset_options)) or "none"
            raise ValueError(f"{type(self).__name__} takes no reset option {unknown}; its reset options are {takes}")
        super().reset(seed=seed)
        self._turn = 0
        self._episode_over = True  # until the new episode is set up: a failed _reset leaves none to step
        task = self._reset(options)
        self._episode_over = False
        self._transcript = [("system", task.system_prompt), ("user", task.observation)]
        info = {"system_prompt": task.system_prompt, "task_id": task.task_id, "stop": list(self.stop), **task.info}
        if self.render_mode == "human":
            print_text(self.transcript)
        return task.observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._episode_over:
            raise RuntimeError(f"{type(self).__name__}: the episode has ended (or never started); call reset()")
        if not isinstance(action, str):
            raise TypeError(f"{type(self).__name__}: an action is one LLM turn as str, got {type(action).__name__}")
        self._turn += 1
        outcome = self._step(action)
        truncated = not outcome.terminated and self._turn >= self.max_turns
        self._episode_over = outcome.terminated or truncated
        observation = "" if self._episode_over else outcome.observation
        self._transcript.append(("assistant", action))
        self._transcript.append(("end" if self._episode_over else "user", outcome.observation))
        info = {
            "reward_components": outcome.rewards,
            "invalid_action": outcome.invalid_action,
            "metrics": outcome.metrics,
            "turn": self._turn,
            **outcome.info,
        }
        if self.render_mode == "human":
            print_text(_format_transcript(self._transcript[-2:]))
        return observation, float(sum(outcome.rewards.values())), outcome.terminated, truncated, info

    def render(self) -> str | None:
        """The episode's transcript as text (system prompt, observations, actions, final message).

        Returned as a string; in ``"human"`` mode it was already printed step by step, so None is returned.
        """
        if self.render_mode == "human":
            return None
        return self.transcript

    @property
    def transcript(self) -> str:
        """The transcript text whatever the render mode."""
        return _format_transcript(self._transcript)

    def _choose_task_index(self, options: dict[str, Any], count: int) -> int:
        """``options["task_index"]`` when given (validated), else a task drawn from the seeded generator."""
        index = options.get("task_index")
        if index is None:
            return int(self.np_random.integers(count))
        return checked_task_index(index, count)

    @property
    def turn(self) -> int:
        """Turns taken in the current episode."""
        return self._turn


def checked_task_index(index: Any, count: int) -> int:
    """``options["task_index"]`` as an int in ``[0, count)``, else a ValueError naming the range. Any integer
    passes, NumPy's included (an index drawn with ``np.random`` is an ``np.int64``); a bool or a float does
    not, though ``True == 1`` and ``3.0 == 3``."""
    if isinstance(index, bool) or not isinstance(index, Integral) or not 0 <= index < count:
        raise ValueError(f"options['task_index'] must be an int in [0, {count}), got {index!r}")
    return int(index)


def print_text(text: str) -> None:
    """``print(text)`` for "human" rendering that no action can make raise: characters stdout cannot encode
    (a lone surrogate in an LLM's turn, an emoji on a Latin-1 console) are printed as backslash escapes, not
    turned into a UnicodeEncodeError from ``step`` (docs/design.md#the-environment-contract, robustness)."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    try:
        text = text.encode(encoding, "backslashreplace").decode(encoding, "replace")
    except LookupError:  # a stream naming a codec Python does not know: keep to ASCII
        text = text.encode("ascii", "backslashreplace").decode("ascii")
    print(text)


def _format_transcript(entries: list[tuple[str, str]]) -> str:
    return "\n\n".join(f"[{role}]\n{text}" for role, text in entries)


def reported_correct(info: dict[str, Any]) -> bool | None:
    """Whether the env says the final answer is right: ``info["correct"]`` (a bool), else
    ``info["metrics"]["correct"]``; None when it says neither (the caller then judges by the reward)."""
    correct = info.get("correct")
    if isinstance(correct, (bool, np.bool_)):
        return bool(correct)
    metrics = info.get("metrics") or {}
    return bool(metrics["correct"]) if "correct" in metrics else None
