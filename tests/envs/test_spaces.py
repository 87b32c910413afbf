"""UnicodeText: any Unicode string within its length bounds, and reproducible samples inside them."""

from __future__ import annotations

import numpy as np
import pytest

from rl_llm.envs.base import Outcome, Task, TextEnv
from rl_llm.envs.spaces import UnicodeText


def test_contains_any_unicode_string_within_the_length_bounds() -> None:
    space = UnicodeText(10, min_length=2)
    assert space.contains("<move>") and space.contains("中文 ß\n\x00")
    assert not space.contains("x") and not space.contains("x" * 11) and not space.contains(b"bytes")


@pytest.mark.parametrize(("min_length", "max_length"), [(0, 1 << 20), (0, 5), (100, 1000), (7, 7)])
def test_samples_are_members_and_reproducible(min_length: int, max_length: int) -> None:
    space = UnicodeText(max_length, min_length=min_length, seed=3)
    samples = [space.sample() for _ in range(20)]
    assert all(space.contains(sample) for sample in samples)
    again = UnicodeText(max_length, min_length=min_length, seed=3)
    assert samples == [again.sample() for _ in range(20)]


def test_samples_draw_from_the_whole_charset_as_gymnasiums_text_would() -> None:
    """The charset tables are built once per process and shared; a space must still sample (and index) exactly
    as Gymnasium's ``Text`` built with the same charset, and each space keeps its own generator."""
    from gymnasium.spaces import Text

    from rl_llm.envs.spaces import SAMPLE_CHARSET

    ours, theirs = UnicodeText(300, seed=5), Text(300, min_length=0, charset=SAMPLE_CHARSET, seed=5)
    assert ours.character_list == theirs.character_list and ours.character_set == theirs.character_set
    assert all(ours.character_index(c) == theirs.character_index(c) for c in SAMPLE_CHARSET)
    drawn = "".join(ours.sample() for _ in range(100))
    assert set(drawn) == set(SAMPLE_CHARSET)  # every character reachable, not just a one-character stand-in
    only_e = (np.arange(len(SAMPLE_CHARSET)) == theirs.character_list.index("é")).astype(np.int8)
    assert set(UnicodeText(5, min_length=5, seed=1).sample(mask=(None, only_e))) == {"é"}  # Text's masked sampling
    five, six = UnicodeText(300, seed=5), UnicodeText(300, seed=6)
    assert [five.sample() for _ in range(3)] != [six.sample() for _ in range(3)]  # generators are not shared


# Characters outside the sampling charset: a tab, accents (Chinook's names), an astral emoji, NUL, a lone surrogate.
UNUSUAL = "a\tí中😀\x00\ud800\r\u202e"


def test_flatten_round_trips_any_unicode_string() -> None:
    """Gymnasium's ``Text`` flattens a character to its charset index and raised KeyError for any other; a
    ``UnicodeText`` member must survive ``flatten``/``unflatten`` whatever its characters."""
    from gymnasium.spaces.utils import flatten, flatten_space, unflatten

    space = UnicodeText(40)
    for text in ("", UNUSUAL, "x" * 40):
        flat = flatten(space, text)
        assert flatten_space(space).contains(flat)
        assert unflatten(space, flat) == text


class _UnusualEnv(TextEnv):
    """Observations full of characters outside ``SAMPLE_CHARSET``, and the action echoed back."""

    reset_options = frozenset()

    def __init__(self) -> None:
        super().__init__(max_turns=2)

    def _reset(self, options: dict) -> Task:
        return Task(observation=f"first {UNUSUAL}", task_id="unusual", system_prompt="Say anything.")

    def _step(self, action: str) -> Outcome:
        return Outcome(f"you said {action}", {"turn": 0.0})


def test_async_vector_env_refuses_shared_memory_and_works_without() -> None:
    """With shared memory (its default) AsyncVectorEnv returned the buffer's first read on every reset and step
    (a megabyte of "a"), or raised KeyError for a character outside the sampling charset; it must refuse
    instead, naming ``shared_memory=False``, with which the envs' own observations come back."""
    import gymnasium as gym

    with pytest.raises(ValueError, match="shared_memory=False"):
        gym.vector.AsyncVectorEnv([_UnusualEnv, _UnusualEnv])
    envs = gym.vector.AsyncVectorEnv([_UnusualEnv, _UnusualEnv], shared_memory=False)
    try:
        observations, _ = envs.reset(seed=0)
        assert observations == (f"first {UNUSUAL}",) * 2
        observations, *_ = envs.step(("é\t1", "😀 2"))
        assert observations == ("you said é\t1", "you said 😀 2")
    finally:
        envs.close()
