"""rl_llm/checks.py: the one set of checks (and words) for numbers, switches and seeds handed to rl-llm by envs'
constructors, agents, sandboxes and the servers' flags."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rl_llm import checks


@pytest.mark.parametrize(("call", "message"), [
    (lambda: checks.integer("horizon", 2.5), r"^horizon must be an integer, got 2.5$"),
    (lambda: checks.integer("horizon", True), r"^horizon must be an integer, got True$"),
    (lambda: checks.integer("k", 4, minimum=1, maximum=3), r"^k must be an integer in 1..3, got 4$"),
    (lambda: checks.integer("seed", -1), r"^seed must be an integer >= 0, got -1$"),
    (lambda: checks.real("p", 1.5, minimum=0.0, maximum=1.0), r"^p must be in \[0.0, 1.0\], got 1.5$"),
    (lambda: checks.real("p", math.nan), r"^p must be a finite number, got nan$"),
    (lambda: checks.reward("w", 1e308), r"^w must be in \[-1000000.0, 1000000.0\], got 1e\+308$"),
    (lambda: checks.reward("penalty", -0.5, minimum=0.0), r"^penalty must be in \[0.0, 1000000.0\], got -0.5$"),
    (lambda: checks.seconds("t", 1e30), r"^t must be a positive number of seconds, at most 1,000,000, got 1e\+30$"),
    (lambda: checks.seconds("t", math.inf), r"^t must be a positive number of seconds, at most 1,000,000, got inf$"),
    (lambda: checks.seconds("t", 0), r"^t must be a positive number of seconds"),
    (lambda: checks.seconds("t", math.nan, allow_zero=True), r"^t must be a non-negative number of seconds"),
    (lambda: checks.seconds("t", "5"), r"^t must be a positive number of seconds, at most 1,000,000, got '5'$"),
    (lambda: checks.flag("f", "false"), r"^f must be true or false, got 'false'$"),
    (lambda: checks.seed_list([0, 1.5]), r"^seeds\[1\] must be an integer, got 1.5$"),
    (lambda: checks.seed_list([None]), r"^seeds\[0\] must be an integer, got None$"),
    (lambda: checks.seed_list("12"), r"^seeds must be a sequence of ints >= 0, got '12'$"),
    (lambda: checks.seed_list(3, allow_none=True), r"^seeds must be a sequence of ints >= 0 \(or None\), got 3$"),
])  # fmt: skip
def test_a_bad_value_is_one_line_naming_it(call, message) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_good_values_come_back_as_plain_python() -> None:
    assert checks.integer("n", np.int64(3)) == 3 and type(checks.integer("n", np.int64(3))) is int
    assert checks.seconds("t", 0, allow_zero=True) == 0.0 and checks.seconds("t", checks.MAX_SECONDS) == 1e6
    assert checks.flag("f", np.bool_(True)) is True
    assert checks.seed_list((np.int32(2), None), allow_none=True) == [2, None]
    assert [type(seed) for seed in checks.seed_list(np.arange(2))] == [int, int]
