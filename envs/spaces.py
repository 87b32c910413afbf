"""A Gymnasium text space that accepts any Unicode string.

Gymnasium's ``Text`` space only admits characters from a fixed charset (alphanumeric by default), which
rejects almost every real LLM turn. ``UnicodeText`` admits any ``str`` within the length bounds, while
sampling stays reproducible from a printable charset so ``check_env`` can step with ``sample()``.
"""

from __future__ import annotations

import functools
import string
from typing import Any, NoReturn

import numpy as np
from gymnasium.error import CustomSpaceError
from gymnasium.spaces import Box, Text
from gymnasium.spaces.utils import flatten, flatten_space, unflatten
from gymnasium.vector.utils import create_shared_memory

# Sampling charset: ASCII printables plus tag characters and a few non-ASCII letters, so random samples
# exercise parsers without being unreadable.
SAMPLE_CHARSET = string.ascii_letters + string.digits + string.punctuation + " \n" + "éßλ中"


_ONE_CHAR = "a"


@functools.cache
def _sample_charset_tables() -> dict[str, Any]:
    """The attributes ``Text`` derives from its charset, for ``SAMPLE_CHARSET``: those in which a space built
    with it differs from one built with ``_ONE_CHAR`` (found by comparing the two, so no private name of
    Gymnasium's is spelt here)."""
    full, small = Text(1, charset=SAMPLE_CHARSET).__dict__, Text(1, charset=_ONE_CHAR).__dict__
    tables = {name: value for name, value in full.items() if name not in small or not _same(small[name], value)}
    if not tables:
        raise RuntimeError("Gymnasium's Text no longer keeps its charset in attributes; UnicodeText needs updating")
    return tables


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # e.g. arrays
        return a is b


class UnicodeText(Text):
    """Any Unicode string of ``min_length`` to ``max_length`` characters."""

    def __init__(self, max_length: int = 65536, *, min_length: int = 0, seed: Any = None) -> None:
        # Text's own checks and seeding, with a one-character charset; then the sampling charset's lookup
        # tables, built once per process: Text builds them per instance, which was most of the cost of
        # making a cheap env (two spaces per env; docs/serving.md#measurements).
        super().__init__(max_length, min_length=min_length, charset=_ONE_CHAR, seed=seed)
        self.__dict__.update(_sample_charset_tables())

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if mask is not None or probability is not None:
            return super().sample(mask=mask, probability=probability)
        # Short samples keep check_env fast (at most 64 characters unless min_length asks for more); the fuzz
        # tests cover long and hostile strings.
        longest = max(self.min_length, min(self.max_length, 64))
        length = int(self.np_random.integers(self.min_length, longest + 1))
        chars = self.np_random.choice(len(self.character_list), size=length)
        return "".join(self.character_list[i] for i in chars)

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )

    def __hash__(self) -> int:
        return hash((UnicodeText, self.min_length, self.max_length))


# Flattening. Gymnasium's ``Text`` flattens each character to its index in the charset, so any character outside
# ``SAMPLE_CHARSET`` (a tab, the "í" of a SQL result) raised KeyError from ``gymnasium.spaces.utils.flatten``.
# ``UnicodeText`` holds any str (docs/design.md#the-environment-contract), so it flattens to code points: an
# int32 array of ``max_length``, padded with ``_PAD``.
_PAD = 0x110000  # one past the last Unicode code point


@flatten.register(UnicodeText)
def _flatten_unicode_text(space: UnicodeText, x: str) -> np.ndarray:
    codes = np.full(space.max_length, _PAD, dtype=np.int32)
    # UTF-32 is one code point per 4 bytes; "surrogatepass" keeps a lone surrogate, which a str may hold.
    codes[: len(x)] = np.frombuffer(x.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    return codes


@unflatten.register(UnicodeText)
def _unflatten_unicode_text(space: UnicodeText, x: np.ndarray) -> str:
    codes = np.asarray(x)
    return codes[codes != _PAD].astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")


@flatten_space.register(UnicodeText)
def _flatten_unicode_text_space(space: UnicodeText) -> Box:
    return Box(low=0, high=_PAD, shape=(space.max_length,), dtype=np.int32)


@create_shared_memory.register(UnicodeText)
def _no_unicode_text_shared_memory(space: UnicodeText, n: int = 1, ctx: Any = None) -> NoReturn:
    """``AsyncVectorEnv(shared_memory=True)``, its default, reads a shared buffer once, at construction, as a
    view: right for arrays, but a text space's read makes new strings, so every later observation it returned
    was that first read (a megabyte of one repeated character, whatever the envs said), and a character
    outside ``SAMPLE_CHARSET`` made ``step`` raise KeyError. Refused as Gymnasium refuses ``Sequence`` spaces:
    ``AsyncVectorEnv`` then raises a ValueError saying to pass ``shared_memory=False``, which works."""
    raise CustomSpaceError(f"{space} holds text of any length: for AsyncVectorEnv pass shared_memory=False")
