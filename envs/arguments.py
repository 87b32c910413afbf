"""Checks for an env's constructor arguments, so that a bad value fails at ``gym.make`` with one line naming the
argument, what it takes and what it got.

Why not let Python fail later: a NaN penalty or noise turns every reward of the episode into NaN without an
error; a float turn limit or horizon plays a turn more than asked; a timeout of ``inf`` or ``1e30`` passes a
``> 0`` check and then overflows deep inside the first query or command; a string reaches arithmetic only on
the code path that uses it (the algorithmic reward's constant, a tool's timeout), mid-episode. Booleans are
refused where a number is meant (``True`` is an int to Python, but ``horizon=True`` is a mistake), numpy
numbers are taken (configs built with numpy hold them).
"""

from __future__ import annotations

import math
import os
from numbers import Integral, Real
from typing import Any

import numpy as np

MAX_SECONDS = 1_000_000.0  # about 11.5 days: past any episode's budget, short of what time APIs overflow on


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


def seconds(name: str, value: Any) -> float:
    """A timeout or time budget: a positive finite number of seconds, at most ``MAX_SECONDS``."""
    return real(name, value, positive=True, maximum=MAX_SECONDS)


def flag(name: str, value: Any) -> bool:
    """A switch: ``True`` or ``False`` (numpy's bool too); a string such as ``"false"`` would be truthy."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return bool(value)


def optional_path(name: str, value: Any) -> Any:
    """A folder or file argument: None, or a non-empty str or path (a number became a folder named ``-1``)."""
    if value is None or (isinstance(value, os.PathLike) or (isinstance(value, str) and value)):
        return value
    raise ValueError(f"{name} must be a path (a non-empty str or os.PathLike) or None, got {value!r}")
