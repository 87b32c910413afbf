"""Answer scoring that must not reward a wrong number: exact match, token F1, numeric match and Math's grader
(punctuation that fused digits, digits of other scripts, superscripts)."""

from __future__ import annotations

import pytest

from rl_llm.envs.math.answers import final_value, is_correct
from rl_llm.envs.qa_scoring import (
    cover_exact_match,
    exact_match,
    f1_score,
    normalize_answer,
    numeric_or_exact_match,
    parse_number,
)
from rl_llm.envs.wrappers.attempts import normalise_answer

# (prediction, gold): punctuation between digits used to vanish, so each pair scored as a match.
FUSED = [("4-5", "45"), ("4.5", "45"), ("4:5", "45"), ("4/5", "45"), ("4,5", "45"), ("1,0000", "10000"),
         ("19-99", "1999"), ("2020-01", "202001")]  # fmt: skip


@pytest.mark.parametrize(("prediction", "gold"), FUSED)
def test_punctuation_between_digits_does_not_fuse_them(prediction: str, gold: str) -> None:
    assert exact_match(prediction, [gold]) == 0.0
    assert numeric_or_exact_match(prediction, [gold]) == 0.0
    assert f1_score(prediction, [gold]) == 0.0
    assert cover_exact_match(prediction, [gold]) == 0.0
    assert normalise_answer(prediction) != normalise_answer(gold)  # TryAgain counts them as two answers


@pytest.mark.parametrize(("prediction", "gold"), [("4-5", "4-5"), ("4.5", "4.5"), ("1,000", "1000"),
                                                  ("1,234,567 people", "1234567 people"), ("2020-01-05", "2020-01-05"),
                                                  ("The Louvre!", "louvre"), ("covid-19", "COVID-19")])  # fmt: skip
def test_the_same_answer_written_the_same_way_still_matches(prediction: str, gold: str) -> None:
    assert exact_match(prediction, [gold]) == 1.0 and numeric_or_exact_match(prediction, [gold]) == 1.0


def test_numbers_keep_their_thousands_separators_and_nothing_else() -> None:
    assert [parse_number(text) for text in ("1,000", "1 000", "1_000", " 1,234,567. ", "12 000.5")] == [
        1000, 1000, 1000, 1234567, 12000.5]  # fmt: skip
    assert [parse_number(text) for text in ("4 5", "4,5", "1,00", "12,3456", "4-5")] == [None] * 5


@pytest.mark.parametrize("written", ["４２", "٤٢", "۴۲", "४२", "4２"])
def test_digits_of_any_script_are_the_number_they_write(written: str) -> None:
    assert parse_number(written) == 42 and normalize_answer(written) == "42"
    assert exact_match(written, ["42"]) == 1.0 and numeric_or_exact_match(written, ["42"]) == 1.0
    assert is_correct(written, "42") and not is_correct(written, "4")
    assert is_correct(f"x = -{written}", "-42") and is_correct(f"\\boxed{{{written}}}", "42")


def test_full_width_separators_read_as_ascii() -> None:
    assert final_value("１，２３４．５") == "1234.5" and parse_number("１，２３４") == 1234


@pytest.mark.parametrize(("written", "not_gold"), [("4²", "42"), ("4²", "4"), ("2³", "23"), ("½", "12"),
                                                   ("4₂", "42"), ("④②", "42"), ("Ⅳ", "4"), ("4万", "4")])  # fmt: skip
def test_other_numerals_are_not_digits(written: str, not_gold: str) -> None:
    # NFKC would turn "4²" (16) into "42": superscripts and the like are refused or compared as written, and
    # Math no longer skips them ("4²" was graded as 4).
    assert final_value(written) is None and not is_correct(written, not_gold)
    assert exact_match(written, [not_gold]) == 0.0 and numeric_or_exact_match(written, [not_gold]) == 0.0


@pytest.mark.parametrize("minus", ["\u2212", "\u2013", "\u2014", "\uff0d", "\ufe63"])
def test_any_minus_sign_reads_as_minus(minus: str) -> None:
    """A Unicode minus ("−4", as typeset math writes it) read as no number at all, so ToolCalls graded the right
    answer -4 wrong; Math already read every minus sign."""
    assert parse_number(f"{minus}4") == -4 and parse_number(f"{minus}4.5") == -4.5
    assert numeric_or_exact_match(f"{minus}4", ["-4"]) == 1.0 and numeric_or_exact_match(f"{minus}4", ["4"]) == 0.0
    assert parse_number(f"4{minus}5") is None  # a range, not a number
