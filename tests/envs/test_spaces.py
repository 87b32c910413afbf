"""UnicodeText: any Unicode string within its length bounds, and reproducible samples inside them."""

from __future__ import annotations

import pytest

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
