"""A Gymnasium text space that accepts any Unicode string.

Gymnasium's ``Text`` space only admits characters from a fixed charset (alphanumeric by default), which
rejects almost every real LLM turn. ``UnicodeText`` admits any ``str`` within the length bounds, while
sampling stays reproducible from a printable charset so ``check_env`` can step with ``sample()``.
"""

from __future__ import annotations

import functools
import string
from typing import Any

from gymnasium.spaces import Text

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

