"""Answer scoring shared by the QA environments: SQuAD-style normalisation, exact match, token F1,
cover exact match (R1-Searcher) and numeric equality."""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence

from rl_llm.envs.parsing import MINUS_SIGNS, ascii_digits

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
# Punctuation between two digits, other than a thousands separator (a comma before exactly three digits).
# Dropped like other punctuation it fused the digits: "4-5", "4.5" and "4:5" all read as "45".
_BETWEEN_DIGITS = re.compile(rf"(?<=\d)(?!,\d{{3}}(?!\d))[{re.escape(string.punctuation)}](?=\d)")
# Thousands separators only between groups of three digits: with every comma and space removed first,
# "4,5" and "4 5" parsed as 45.
_INTEGER_PART = r"(?:\d{1,3}(?:,\d{3})+|\d{1,3}(?:_\d{3})+|\d{1,3}(?: \d{3})+|\d+)"
_NUMBER = re.compile(rf"[-+]?(?:{_INTEGER_PART}(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation, drop the articles a/an/the, squeeze whitespace (SQuAD / Search-R1).

    Digits of any script are read as ASCII digits (``４２`` is ``42``), and punctuation between two digits
    separates them rather than vanishing (``4-5`` is ``4 5``, not ``45``), except a thousands separator
    (``1,000`` is ``1000``)."""
    text = _BETWEEN_DIGITS.sub(" ", ascii_digits(text))
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def answer_in_texts(texts: Iterable[str], normalized_golds: Sequence[str]) -> bool:
    """Whether some gold answer occurs inside some text, both normalised (Search-R1's "the answer was
    retrieved" check). ``normalized_golds`` are already passed through :func:`normalize_answer`."""
    for text in texts:
        normalized = normalize_answer(text)
        if any(gold in normalized for gold in normalized_golds):
            return True
    return False


def exact_match(prediction: str, answers: Iterable[str]) -> float:
    normalized = normalize_answer(prediction)
    return float(any(normalized == normalize_answer(answer) for answer in answers))


def cover_exact_match(prediction: str, answers: Iterable[str]) -> float:
    """R1-Searcher's cover EM: every token of a gold answer occurs in the prediction (any order)."""
    tokens = set(normalize_answer(prediction).split(" "))
    return float(any(all(t in tokens for t in normalize_answer(a).split(" ")) for a in answers))


def f1_score(prediction: str, answers: Iterable[str]) -> float:
    """Best token-level F1 over the gold answers; yes/no/noanswer must match exactly (HotpotQA rule)."""
    best = 0.0
    predicted = normalize_answer(prediction)
    for answer in answers:
        gold = normalize_answer(answer)
        if (predicted in ("yes", "no", "noanswer") or gold in ("yes", "no", "noanswer")) and predicted != gold:
            continue
        common = Counter(predicted.split()) & Counter(gold.split())
        same = sum(common.values())
        if same:
            precision, recall = same / len(predicted.split()), same / len(gold.split())
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def parse_number(text: str) -> float | None:
    """A number written alone, else None: digits of any script, any minus sign (``\u22124`` is -4, as in Math),
    thousands separators (``,``, ``_`` or a space between groups of three digits), surrounding spaces and a
    trailing period allowed."""
    cleaned = ascii_digits(text.strip().rstrip(".").rstrip()).translate(MINUS_SIGNS)
    if len(cleaned) > 64 or not _NUMBER.fullmatch(cleaned):
        return None
    value = float(cleaned.replace(",", "").replace(" ", ""))  # float() itself reads "_" between digits
    return value if math.isfinite(value) else None


def numeric_or_exact_match(prediction: str, answers: Iterable[str], rel_tol: float = 1e-6) -> float:
    """Numbers compare by value (``12,000`` = ``12000.0``), everything else by exact match."""
    answers = list(answers)
    predicted = parse_number(prediction)
    golds = [gold for gold in map(parse_number, answers) if gold is not None]
    if predicted is not None and golds:
        # By value alone: exact match drops punctuation, so falling back to it passed "-4" for 4 and "4.5" for 45.
        return float(any(math.isclose(predicted, gold, rel_tol=rel_tol, abs_tol=1e-9) for gold in golds))
    return exact_match(prediction, answers)
