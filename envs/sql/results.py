"""Execution match: do two queries' result tables hold the same answer?

Rules (Spider/BIRD execution accuracy, made explicit):
- rows are compared as a multiset (duplicates count) unless the gold query orders its output, then as a list;
- numbers compare by value (``1 == 1.0``) with a relative/absolute float tolerance; text and blobs exactly;
- column names never matter, and column order does not either: when the columns as given do not match, every
  column permutation whose columns hold the same values as the gold columns is tried (few exist in practice).

``sets_match`` is SkyRL-SQL's rule instead: ``frozenset(pred) == frozenset(gold)``, so row order and duplicate
rows never matter, values compare with Python equality (``1 == 1.0``, no tolerance) and column order does.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any

import sqlglot
from sqlglot import exp

Row = tuple[Any, ...]
# Column permutations tried at most (they are built only from columns with matching contents).
MAX_PERMUTATIONS = 64
# Decimal places floats are rounded to for sorting and column signatures; equality still uses the tolerance.
_ROUND_DIGITS = 6


def has_top_level_order_by(sql: str) -> bool:
    """True when the outermost query sorts its output (then row order is part of the answer)."""
    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
    except Exception:  # sqlglot raises several error types (and RecursionError on deep nesting)
        return "order by" in " ".join(sql.lower().split())
    return isinstance(tree, exp.Query) and tree.args.get("order") is not None


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _sort_key(value: Any) -> tuple[int, Any]:
    """A total order over SQLite values: NULL < numbers < text < blobs (as SQLite sorts them)."""
    if value is None:
        return (0, 0)
    number = _number(value)
    if number is not None:
        return (1, 0.0 if math.isnan(number) else round(number, _ROUND_DIGITS))
    if isinstance(value, str):
        return (2, value)
    return (3, bytes(value))


def values_equal(a: Any, b: Any, tolerance: float) -> bool:
    x, y = _number(a), _number(b)
    if x is not None and y is not None:
        return math.isclose(x, y, rel_tol=tolerance, abs_tol=tolerance) or (math.isnan(x) and math.isnan(y))
    return a == b and type(a) is type(b)


def _rows_equal(a: Sequence[Row], b: Sequence[Row], tolerance: float) -> bool:
    return all(values_equal(x, y, tolerance) for row_a, row_b in zip(a, b) for x, y in zip(row_a, row_b))


def _sorted_rows(rows: Sequence[Row]) -> list[Row]:
    return sorted(rows, key=lambda row: tuple(_sort_key(value) for value in row))


def _column_signature(rows: Sequence[Row], index: int) -> tuple[tuple[int, Any], ...]:
    return tuple(sorted(_sort_key(row[index]) for row in rows))


def _candidate_permutations(pred: Sequence[Row], gold: Sequence[Row], width: int) -> Iterator[tuple[int, ...]]:
    """Orders of the predicted columns that put, under every gold column, a column with the same values."""
    pred_signatures = [_column_signature(pred, i) for i in range(width)]
    gold_signatures = [_column_signature(gold, i) for i in range(width)]
    options = [[i for i in range(width) if pred_signatures[i] == gold_signatures[j]] for j in range(width)]

    def extend(prefix: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        if len(prefix) == width:
            yield prefix
            return
        for i in options[len(prefix)]:
            if i not in prefix:
                yield from extend((*prefix, i))

    if all(options):
        yield from extend(())


def results_match(
    pred: Sequence[Row], gold: Sequence[Row], *, ordered: bool = False, tolerance: float = 1e-6
) -> bool:
    """True when ``pred`` holds the same answer as ``gold`` (see the module docstring for the rules)."""
    if len(pred) != len(gold):
        return False
    if not gold:
        return True
    width = len(gold[0])
    if any(len(row) != width for row in pred) or any(len(row) != width for row in gold):
        return False
    reference = gold if ordered else _sorted_rows(gold)  # sorted once, compared against every column order

    def same_rows(rows: Sequence[Row]) -> bool:
        return _rows_equal(rows if ordered else _sorted_rows(rows), reference, tolerance)

    if same_rows(pred):
        return True
    identity = tuple(range(width))
    for permutation in islice(_candidate_permutations(pred, gold, width), MAX_PERMUTATIONS):
        if permutation != identity and same_rows([tuple(row[i] for i in permutation) for row in pred]):
            return True
    return False


def sets_match(pred: Sequence[Row], gold: Sequence[Row]) -> bool:
    """SkyRL-SQL's execution match: the two results hold the same set of rows (order and duplicates ignored)."""
    return frozenset(map(tuple, pred)) == frozenset(map(tuple, gold))
