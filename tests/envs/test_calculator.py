"""The calculator tool: arithmetic through ``ast`` only, with bounded sizes and clear refusals."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_llm.envs.qa_scoring import numeric_or_exact_match, parse_number
from rl_llm.envs.tools import CalculatorError, calculate, format_number


@pytest.mark.parametrize(
    ("expression", "value"),
    [("1 + 2 * 3", 7), ("(2023 - 1954) * 2", 138), ("7 / 2", 3.5), ("7 // 2", 3), ("-7 % 3", 2), ("2 ** 10", 1024),
     ("abs(1942 - 1949)", 7), ("max(3, 9, 4) - min(2, 8)", 7), ("round(2.567, 2)", 2.57), ("sqrt(16)", 4.0),
     ("-(-3)", 3), ("1e3 + 1", 1001.0), ("+".join(["2"] * 200), 400), ("pi > 3", None)],
)  # fmt: skip
def test_calculator_evaluates_arithmetic(expression, value) -> None:
    if value is None:
        with pytest.raises(CalculatorError):
            calculate(expression)
        return
    assert calculate(expression) == pytest.approx(value)


@pytest.mark.parametrize(
    ("expression", "message"),
    [("__import__('os').system('id')", "only numbers"), ("().__class__", "only numbers"), ("x + 1", "only numbers"),
     ("(lambda: 1)()", "only numbers"), ("open('/etc/passwd')", "only numbers"), ("9 ** 9 ** 9", "exponents are limited"),
     ("10 ** 400", "limited to 300 digits"), ("1 / 0", "division by zero"), ("1,234 + 1", "commas"),
     ("2 ^ 3", "write a \\*\\* b"), ("exp(1000)", "too large"), ("sqrt(-1)", "invalid operation"), ("", "empty"),
     ("1 +", "not a valid arithmetic expression"), ("1" * 600, "over 500 characters"), ("-" * 300 + "1", "nested"),
     ("max()", "1 to 8"), ("True + 1", "only numbers"), ("(-8) ** 0.5", "not a real number"),
     ("round(2, -10 ** 8)", "at most 300 digits")],
)  # fmt: skip
def test_calculator_refuses_everything_else_with_a_reason(expression, message) -> None:
    with pytest.raises(CalculatorError, match=message):
        calculate(expression)


@settings(max_examples=200)
@given(st.one_of(st.text(max_size=60), st.text(alphabet="0123456789+-*/%().e ,^", max_size=80)))
def test_calculator_never_fails_with_anything_but_a_calculator_error(expression) -> None:
    try:
        value = calculate(expression)
    except CalculatorError as exc:
        assert str(exc) and "invalid operation: only" not in str(exc)
    else:
        assert isinstance(value, int | float)


def test_number_formatting_and_numeric_answers() -> None:
    assert format_number(4.0) == "4" and format_number(2 / 3) == "0.666666666667" and format_number(12) == "12"
    assert parse_number(" 1,234,567. ") == 1234567 and parse_number("12 apples") is None
    assert numeric_or_exact_match("1,234", ["1234"]) == 1.0
    assert numeric_or_exact_match("1234.0", ["1234"]) == 1.0
    assert numeric_or_exact_match("1235", ["1234"]) == 0.0
    assert numeric_or_exact_match("The Louvre", ["louvre"]) == 1.0
