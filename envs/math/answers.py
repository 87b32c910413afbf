"""Reading and grading a final answer: ``<answer>`` tags or ``\\boxed{}``, checked with ``math-verify``.

``math-verify`` compares by value, so on its own it would accept ``5 - 3 - 6`` for ``-4`` (sympy evaluates
the expression) and a policy could score by restating the question. The answer must therefore first reduce
to a single evaluated number (``final_value``): what follows the last ``=``, with LaTeX delimiters, ``\\text``
wrappers, units and thousands separators allowed, and no operator, function or second number. Then
``math-verify`` decides equality of that number (``-4.0``, ``$-4$``, ``x = -4``, ``-4 \\text{ legs}`` are
all right for ``-4``). Digits of any script count as their ASCII digits (``４２``, ``٤٢`` are 42); other
numerals (``4²``, ``½``) make the answer an expression.

Every step is linear in the text, and ``math-verify`` only ever sees a short string (``MAX_ANSWER_CHARS``).
"""

from __future__ import annotations

import re
import threading
import unicodedata

from rl_llm.envs.parsing import MINUS_SIGNS, ascii_digits, extract_tag

FORMATS = ("answer", "boxed")
#: Longer answers are graded wrong without parsing: no final value needs more.
MAX_ANSWER_CHARS = 200
_BOXED = "\\boxed{"
_WRAPPERS = re.compile(r"\\(?:text|mathrm|textbf|mathbf|boxed|operatorname)\s*\{([^{}]*)\}")
_SPACING = ("\\,", "\\!", "\\;", "\\:", "\\ ", "\\%", "\\$", "\\left", "\\right", "$", "%")
_DELIMITERS = ("\\(", "\\)", "\\[", "\\]")
_NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")
# Anything that makes the answer an expression rather than a value.
_EXPRESSION_CHARS = frozenset("^!*/×÷·()[]{}<>|\\")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (balanced braces), or None when there is none or it is unclosed."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, position = 1, start + len(_BOXED)
    for index in range(position, len(text)):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[position:index].strip()
    return None


def extract_answer(text: str, answer_format: str) -> str | None:
    """The final answer of a turn in ``answer_format`` (the last tag or box), or None when it has none."""
    answer = extract_tag(text, "answer", last=True) if answer_format == "answer" else last_boxed(text)
    return answer if answer else None


def final_value(answer: str) -> str | None:
    """The number an answer gives (``"x = -1,234 legs"`` -> ``"-1234"``), or None when it is an expression,
    holds several numbers, or none."""
    if len(answer) > MAX_ANSWER_CHARS:
        return None
    # Digits of any script as ASCII ("４２", "٤٢"); Unicode minus signs; LaTeX thousands separator.
    text = ascii_digits(answer).translate(MINUS_SIGNS).replace("{,}", ",")
    for delimiter in _DELIMITERS:
        text = text.replace(delimiter, " ")
    text = text.rsplit("=", 1)[-1]  # "x = 5", "5 - 3 - 6 = -4": the value is after the last "="
    for _ in range(3):  # nested wrappers: \boxed{\text{5}}
        text = _WRAPPERS.sub(r" \1 ", text)
    for spacing in _SPACING:
        text = text.replace(spacing, " ")
    if any(char in _EXPRESSION_CHARS or _other_numeral(char) for char in text):
        return None
    numbers = list(_NUMBER.finditer(text))
    if len(numbers) != 1:
        return None
    (number,) = numbers
    sign = "-" if text[: number.start()].rstrip().endswith("-") else ""
    return sign + number[0].replace(",", "")


def _other_numeral(char: str) -> bool:
    """A numeral that is not a decimal digit (``²``, ``½``, ``Ⅳ``, ``万``): the answer is then an expression.
    Skipped, ``4²`` was read as 4; folded by NFKC, it would read as 42."""
    return not char.isascii() and unicodedata.numeric(char, None) is not None


def _timeout() -> int | None:
    # math-verify's timeouts use SIGALRM, which only the main thread may set (envs also run in worker threads;
    # there the short, operator-free input is what bounds the work).
    return 5 if threading.current_thread() is threading.main_thread() else None


def is_correct(answer: str, gold: str) -> bool:
    """Whether ``answer`` (an extracted final answer) equals the integer ``gold``, per the module's rule."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    value = final_value(answer)
    if value is None:
        return False
    timeout = _timeout()
    expected = parse(gold, [ExprExtractionConfig()], parsing_timeout=timeout)
    predicted = parse(value, [LatexExtractionConfig(), ExprExtractionConfig()], parsing_timeout=timeout)
    return bool(predicted) and verify(expected, predicted, timeout_seconds=timeout)
