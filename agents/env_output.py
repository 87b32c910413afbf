"""What an env's ``reset``/``step`` must return for the rollout engine to record it, checked once per call.

Envs are user code (any registered Gymnasium env id can be played). A NaN or infinite reward went into the
trajectory, then into the group's advantages and the loss, and one optimizer step later every weight of the
model was NaN, with no word of which env did it; a reward of ``"1"`` or an observation that is not text
raised deep inside the recorder and stopped the whole rollout. Each problem below fails only its episode
(``trajectory.error`` names the env call and the value), which the trainer leaves out of the update.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from numbers import Integral, Real
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


def _flag_problem(value: Any, what: str) -> str | None:
    """A switch the engine branches on (``terminated``, ``info["invalid_action"]``): a bool, numpy's, 0 or 1.
    An array raised "truth value is ambiguous" out of the whole rollout; the string "False" was true."""
    if type(value) is bool or (getattr(value, "shape", None) == () and getattr(value.dtype, "kind", "") == "b"):
        return None
    if isinstance(value, Real) and value in (0, 1):
        return None
    return f"{what} that is not a bool: {value!r}"[:200]


def _start_problem(info: Any, who: str = "") -> str | None:
    """What a reset's info says about the episode: ``stop`` a list of str (a bare "</a>" became the stop
    strings "<", "/", "a", ">"), ``system_prompt`` a str (an int reached the chat template's traceback)."""
    stop = info.get("stop", ())
    if isinstance(stop, str) or not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        return f"an info['stop']{who} that is not a list of str: {stop!r}"[:200]
    if not isinstance(info.get("system_prompt", ""), str):
        return f"an info['system_prompt']{who} that is not text: {type(info['system_prompt']).__name__}"
    return None


def reset_problem(observation: Any, info: Any) -> str | None:
    """None when a single-agent ``reset`` gave ``(str, dict)`` with a usable ``stop``/``system_prompt``, else
    what is wrong."""
    return _text_problem(observation, info) or _start_problem(info)


def step_problem(observation: Any, reward: Any, info: Any, terminated: Any = False,
                 truncated: Any = False) -> str | None:  # fmt: skip
    """None when a single-agent ``step`` gave a text observation, a finite reward, a dict and bool flags,
    else what is wrong."""
    return (_text_problem(observation, info) or _reward_problem(reward)
            or _flag_problem(terminated, "a terminated") or _flag_problem(truncated, "a truncated")
            or _flag_problem(info.get("invalid_action", False), "an info['invalid_action']"))  # fmt: skip


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
        if problem is None and rewards is None:
            problem = _start_problem(infos[name], who)
        if problem is None and rewards is not None:
            problem = (_reward_problem(rewards.get(name, 0.0), who)
                       or _flag_problem(infos[name].get("invalid_action", False), f"an info['invalid_action']{who}")
                       or next((p for flag in flags if (p := _flag_problem(flag.get(name, False), f"a flag{who}"))),
                               None))  # fmt: skip
        if problem is not None:
            return problem
    return None


def token_problem(token_ids: Sequence[Any], logprobs: Sequence[Any]) -> str | None:
    """What is wrong with a token backend's completion, or None: one log-prob per token (a shorter list shifted
    every later token's log-prob, with no error), token ids that are ints >= 0, log-probs finite (a NaN one
    reaches the loss as a NaN reward does). Once per turn, so cheap: a sum is finite only if every term is."""
    if len(token_ids) != len(logprobs):
        return f"{len(token_ids)} token ids but {len(logprobs)} log-probs"
    if token_ids and (not all(type(t) is int or isinstance(t, Integral) for t in token_ids) or min(token_ids) < 0):
        return f"token ids that are not all integers >= 0: {list(token_ids)[:20]!r}"[:200]
    try:
        finite = math.isfinite(sum(logprobs))
    except TypeError:  # not numbers
        finite = False
    if not finite:
        return f"log-probs that are not all finite numbers: {list(logprobs)[:20]!r}"[:200]
    return None
