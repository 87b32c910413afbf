"""``-k key=value`` of the servers' and packagers' command lines: a key given twice is refused."""

from __future__ import annotations

import pytest

from rl_llm.integrations.generic import parse_kwarg_pairs


def test_a_key_given_twice_is_refused() -> None:
    # the last value won silently before, as in `rl-llm eval -k` (rl_llm/cli.py) and `rl-llm train` overrides
    with pytest.raises(ValueError, match=r"^-k max_turns is given twice; give each key once$"):
        parse_kwarg_pairs(["max_turns=5", "opponent=minimax", "max_turns=9"])
    assert parse_kwarg_pairs(["max_turns=5", "opponent=minimax"]) == {"max_turns": 5, "opponent": "minimax"}
