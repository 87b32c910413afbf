"""The one set of checks for a number, switch, path or seed list handed to rl-llm: an env's constructor argument,
an agent's or a sandbox's setting, a server's flag. A bad value fails where it is given (``gym.make``, a
constructor, argparse) with one line naming it, what it takes and what it got, in the same words everywhere.

Why not let Python fail later: a NaN penalty or noise turns every reward of the episode into NaN without an
error; a float turn limit or horizon plays a turn more than asked; a timeout of ``inf`` or ``1e30`` passes a
``> 0`` check and then overflows deep inside the first query or command; a string reaches arithmetic only on
the code path that uses it (the algorithmic reward's constant, a tool's timeout), mid-episode. Booleans are
refused where a number is meant (``True`` is an int to Python, but ``horizon=True`` is a mistake), numpy
numbers are taken (configs built with numpy hold them). Every layer may import this module (it is rl-llm's
core), so envs, agents, sandboxes and the servers share one wording and one longest timeout.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from numbers import Integral, Real
from typing import Any

# About 11.5 days: past any episode's, command's or session's budget, short of where the clocks and waits
# overflow (``inf`` or ``1e30`` passed ``> 0`` and raised OverflowError deep inside a wait or a socket).
MAX_SECONDS = 1_000_000.0
# The largest magnitude of a reward-scale setting: far past any reward a run trains on, far short of overflow.
MAX_REWARD = 1_000_000.0


def integer(name: str, value: Any, *, minimum: int = 0, maximum: int | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]``, else a ValueError."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise ValueError(f"{name} must be an integer {bound}, got {value!r}")
    return int(value)


def real(name: str, value: Any, *, minimum: float | None = None, maximum: float | None = None,
         positive: bool = False) -> float:  # fmt: skip
    """``value`` as a finite float (``> 0`` with ``positive``, else within the bounds given), else a ValueError."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if positive and not value > 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"<= {maximum}" if minimum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    return float(value)


def reward(name: str, value: Any, *, minimum: float = -MAX_REWARD) -> float:
    """A reward-scale setting (a penalty, a weight, an arm's mean, a noise level): a finite float in
    ``[minimum, MAX_REWARD]``. Finite is not enough: near 1e308 the env's own arithmetic on two of them (a
    difference, a sum of reward terms, the cumulative regret) overflows to inf, and then NaN."""
    return real(name, value, minimum=minimum, maximum=MAX_REWARD)


def seconds(name: str, value: Any, *, allow_zero: bool = False) -> float:
    """A timeout or time budget: a finite number of seconds, positive (or 0 with ``allow_zero``), at most
    ``MAX_SECONDS``; NaN, infinity and True are refused."""
    if isinstance(value, bool) or not isinstance(value, Real) or not (
        (value >= 0 if allow_zero else value > 0) and value <= MAX_SECONDS  # NaN fails both comparisons
    ):
        sign = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{name} must be a {sign} number of seconds, at most {MAX_SECONDS:,.0f}, got {value!r}")
    return float(value)


def seed_list(values: Any, *, allow_none: bool = False) -> list[Any]:
    """A list of episode seeds, each an int >= 0 (None too with ``allow_none``: unseeded), numpy integers as
    Python ints. ``int(seed)`` made 2.7 seed 2 and True seed 1; numpy refuses a negative seed only inside
    ``env.reset``, once per episode."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        kinds = "ints >= 0 (or None)" if allow_none else "ints >= 0"
        raise ValueError(f"seeds must be a sequence of {kinds}, got {values!r}")
    return [None if seed is None and allow_none else integer(f"seeds[{index}]", seed)
            for index, seed in enumerate(values)]  # fmt: skip


def flag(name: str, value: Any) -> bool:
    """A switch: ``True`` or ``False`` (numpy's bool too); a string such as ``"false"`` would be truthy."""
    if isinstance(value, bool):
        return value
    import numpy as np  # here: the servers' and sandboxes' imports stay light

    if not isinstance(value, np.bool_):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return bool(value)


def optional_path(name: str, value: Any) -> Any:
    """A folder or file argument: None, or a non-empty str or path (a number became a folder named ``-1``)."""
    if value is None or (isinstance(value, os.PathLike) or (isinstance(value, str) and value)):
        return value
    raise ValueError(f"{name} must be a path (a non-empty str or os.PathLike) or None, got {value!r}")
