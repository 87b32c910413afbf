"""What an env's ``reset``/``step`` must return for the rollout engine to record it, checked once per call.

Envs are user code (any registered Gymnasium env id can be played). A NaN or infinite reward went into the
trajectory, then into the group's advantages and the loss, and one optimizer step later every weight of the
model was NaN, with no word of which env did it; a reward of ``"1"`` or an observation that is not text
raised deep inside the recorder and stopped the whole rollout. Each problem below fails only its episode
(``trajectory.error`` names the env call and the value), which the trainer leaves out of the update.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from numbers import Real
from typing import Any

# Exact types first: ``isinstance(x, Real)`` is an ABC check, and the engine runs these on every env step.
_FLOAT_TYPES = frozenset({float, int})


def _numbers(values: Iterable[Any]) -> bool:
    """Whether every value is a real number (bools and numpy numbers count)."""
    return all(type(value) in _FLOAT_TYPES or isinstance(value, Real) for value in values)


def _reward_problem(reward: Any, who: str = "") -> str | None:
    if type(reward) is float:
        return None if math.isfinite(reward) else f"a reward{who} of {reward} (rewards must be finite)"
    if not isinstance(reward, Real):
        return f"a reward{who} that is not a number: {reward!r}"[:200]
    if not math.isfinite(reward):
        return f"a reward{who} of {reward} (rewards must be finite)"
    return None


def _text_problem(observation: Any, info: Any, who: str = "") -> str | None:
    if not isinstance(observation, str):
        return f"an observation{who} that is not text: {type(observation).__name__}"
    if type(info) is not dict and not isinstance(info, Mapping):
        return f"an info{who} that is not a dict: {type(info).__name__}"
    for key in ("metrics", "reward_components"):  # recorded as floats
        numbers = info.get(key, {})
        if not (type(numbers) is dict or isinstance(numbers, Mapping)) or not _numbers(numbers.values()):
            return f"an info[{key!r}]{who} that is not a dict of numbers: {numbers!r}"[:200]
    return None


def reset_problem(observation: Any, info: Any) -> str | None:
    """None when a single-agent ``reset`` gave ``(str, dict)``, else what is wrong."""
    return _text_problem(observation, info)


def step_problem(observation: Any, reward: Any, info: Any) -> str | None:
    """None when a single-agent ``step`` gave a text observation, a finite reward and a dict, else what is wrong."""
    return _text_problem(observation, info) or _reward_problem(reward)


def game_problem(names: Iterable[str], observations: Any, infos: Any, rewards: Any = None,
                 *flags: Any) -> str | None:  # fmt: skip
    """The same for a PettingZoo parallel env's ``reset`` (no rewards) or ``step`` (with its terminations and
    truncations as ``flags``), for every player named: dicts keyed by player, each player's observation and
    info present (a reward or flag may be missing: 0 and False)."""
    parts = [("observations", observations), ("infos", infos)]
    if rewards is not None:
        parts += [("rewards", rewards), *(("terminations or truncations", flag) for flag in flags)]
    for label, value in parts:
        if not isinstance(value, Mapping):
            return f"{label} that are not a dict keyed by player: {type(value).__name__}"
    for name in names:
        if name not in observations or name not in infos:
            return f"no observation or info for player {name!r}"
        who = f" for {name!r}"
        problem = _text_problem(observations[name], infos[name], who)
        if problem is None and rewards is not None:
            problem = _reward_problem(rewards.get(name, 0.0), who)
        if problem is not None:
            return problem
    return None
