"""Made-up, pronounceable names, so that no language model knows the facts of the knowledge base.

Every name word is fresh (no word is shared between two entities), which keeps mentions unambiguous: a
passage mentions an entity exactly when it contains a word of its name.
"""

from __future__ import annotations

import numpy as np

_ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "st", "tr",
           "sh", "th", "kr")  # fmt: skip
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei")
_CODAS = ("", "", "", "n", "r", "l", "s", "m", "x", "nd", "rk")
_RESERVED = frozenset({"that", "there", "these", "they", "this", "will", "with", "their", "then", "into", "such",
                       "than", "them", "were", "when", "what", "which", "where", "born", "city", "does"})  # fmt: skip


class NameMaker:
    """Draws unique capitalised words of 2-3 syllables from a seeded generator."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def _syllable(self) -> str:
        rng = self.rng
        return (_ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))]
                + _CODAS[rng.integers(len(_CODAS))])  # fmt: skip

    def word(self, suffix: str = "") -> str:
        while True:
            syllables = 2 + int(self.rng.random() < 0.2)
            word = ("".join(self._syllable() for _ in range(syllables)) + suffix).capitalize()
            if word.lower() not in self.used and word.lower() not in _RESERVED:
                self.used.add(word.lower())
                return word
