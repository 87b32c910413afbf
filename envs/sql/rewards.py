"""Partial rewards for Text2SQL (Reasoning-SQL, Think2SQL, SkyRL-SQL), all in [0, 1] except ``format_penalty``.

- ``execution``: 1 when the predicted query's result matches the gold result (see ``results.py``).
- ``syntax``: 1 when the prediction is exactly one query (SELECT/WITH/UNION/VALUES) that executes without
  error (Reasoning-SQL's ``R_syn``: "the SQL executes").
- ``schema_linking``: Jaccard similarity of the tables and ``table.column`` pairs the two queries use
  (Reasoning-SQL's ``R_SL``). Every item counts, including tables and columns that do not exist (an unknown
  unqualified column counts as ``?.name``), and a projected ``*`` / ``t.*`` stands for every column of the
  tables it covers (``COUNT(*)`` reads no column).
- ``ngram``: Jaccard similarity of the lower-cased whitespace-token bigrams of the two queries.

The three partial terms (``syntax``, ``schema_linking``, ``ngram``) are 0 for a prediction that does not
execute, so a query that fails never earns more than one that runs and is wrong (``SELECT 1``).
- ``format``: 1 when every turn thinks in ``<think>...</think>`` before its action and the episode ends with
  exactly one ``<solution>`` (``format_rule="every_turn"``), or under ``format_rule="skyrl"`` SkyRL-SQL's
  ``verify_format_and_extract`` on the whole chat (``skyrl_format``); ``format_penalty`` is ``format - 1``
  (SkyRL-SQL's -1 for a bad format).

The reward is ``sum(weight[name] * score[name])``; ``REWARD_PRESETS`` holds the published weightings.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping

import sqlglot
from sqlglot import exp

from rl_llm import checks

REWARD_NAMES = ("execution", "syntax", "schema_linking", "ngram", "format", "format_penalty")
REWARD_PRESETS: dict[str, dict[str, float]] = {
    "execution": {"execution": 1.0},
    # Think2SQL: 0.85 EX + 0.15 format.
    "think2sql": {"execution": 0.85, "format": 0.15},
    # Reasoning-SQL (re-implementation defaults; the LLM-judge term is left out): 3 EX + syntax + schema
    # linking + n-gram + 0.5 format.
    "reasoning_sql": {"execution": 3.0, "syntax": 1.0, "schema_linking": 1.0, "ngram": 1.0, "format": 0.5},
    # SkyRL-SQL: execution, and -1 (whatever the execution) when the format is broken; see PRESET_PROTOCOLS.
    "skyrl": {"execution": 1.0, "format_penalty": 1.0},
}
# Episode rules a preset brings with it (the env's arguments left at None take these):
# ``max_turns``, ``result_match`` ("multiset": Spider/BIRD rows as a multiset, or a list under a gold ORDER BY;
# "set": SkyRL-SQL's ``frozenset(pred) == frozenset(gold)``) and ``format_gate`` (a broken format zeroes every
# other term, so the reward is exactly ``weight * -1``: SkyRL-SQL's code returns -1 before it executes anything).
# ``format_rule``: "every_turn" (each turn thinks before its action) or "skyrl" (``skyrl_format``).
DEFAULT_PROTOCOL: dict[str, object] = {
    "max_turns": 5, "result_match": "multiset", "format_gate": False, "format_rule": "every_turn",
}
PRESET_PROTOCOLS: dict[str, dict[str, object]] = {
    "skyrl": {"max_turns": 5, "result_match": "set", "format_gate": True, "format_rule": "skyrl"},
}
RESULT_MATCHES = ("multiset", "set")
FORMAT_RULES = ("every_turn", "skyrl")
_SOLUTION_INNER_TAGS = re.compile(r"</?(think|sql|observation)\b", re.IGNORECASE)
# Predictions longer than this are not handed to sqlglot (its parser is recursive and not linear-time).
MAX_PARSE_CHARS = 20_000


def resolve_weights(weights: str | Mapping[str, float] | None) -> dict[str, float]:
    """A preset name or a ``{name: weight}`` mapping, checked; zero weights are dropped."""
    if weights is None:
        weights = "execution"
    if isinstance(weights, str):
        if weights not in REWARD_PRESETS:
            raise ValueError(f"unknown reward preset {weights!r}; choose from {sorted(REWARD_PRESETS)}")
        weights = REWARD_PRESETS[weights]
    if not isinstance(weights, Mapping):
        raise ValueError(f"reward_weights must be a preset name or a {{term: weight}} dict, got {weights!r}")
    unknown = set(weights) - set(REWARD_NAMES)
    if unknown:
        raise ValueError(f"unknown reward terms {sorted(unknown)}; choose from {list(REWARD_NAMES)}")
    # a NaN or infinite weight made every reward of the run NaN or inf without an error
    checked = {name: checks.reward(f"reward_weights[{name!r}]", weights[name]) for name in REWARD_NAMES if name in weights}
    return {name: weight for name, weight in checked.items() if weight != 0}


def parse_query(sql: str) -> exp.Query | None:
    """The sqlglot tree of a single SQLite query, or None when it is not one."""
    if not sql.strip() or len(sql) > MAX_PARSE_CHARS:
        return None
    try:
        trees = [tree for tree in sqlglot.parse(sql, read="sqlite") if tree is not None]
    except Exception:  # ParseError, TokenError, and RecursionError on pathological nesting
        return None
    return trees[0] if len(trees) == 1 and isinstance(trees[0], exp.Query) else None


def syntax_score(sql: str) -> float:
    """Parse check only; the env's ``syntax`` term also requires the query to execute (see ``SqlScorer``)."""
    return float(parse_query(sql) is not None)


def schema_items(tree: exp.Expression, schema: Mapping[str, Iterable[str]] | None = None) -> set[str]:
    """Tables and ``table.column`` pairs a query uses, lower-cased, with aliases resolved.

    Unqualified columns are attributed through ``schema`` (table -> columns) to the query's tables that have
    them; one that no table has is ``?.name`` (it counts against the query, as a wrong table would). A
    projected ``*`` adds every column of the query's tables, ``t.*`` every column of ``t`` (a query that
    reads everything references everything); ``COUNT(*)`` adds none. Columns of CTEs and subqueries are
    derived, not schema items, and are left out.
    """
    derived = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    derived |= {sub.alias_or_name.lower() for sub in tree.find_all(exp.Subquery) if sub.alias_or_name}
    aliases: dict[str, str] = {}
    for table in tree.find_all(exp.Table):
        name = table.name.lower()
        if name and name not in derived:
            aliases[table.alias_or_name.lower()] = name
    tables = set(aliases.values())
    columns_of = {t.lower(): {c.lower() for c in cols} for t, cols in (schema or {}).items()}
    items = set(tables)

    def all_columns(table: str) -> set[str]:
        return {f"{table}.{column}" for column in columns_of.get(table, ())}

    for star in tree.find_all(exp.Star):
        if isinstance(star.parent, exp.Select):  # SELECT * (not COUNT(*), whose parent is the function)
            for table in tables:
                items |= all_columns(table)
    for column in tree.find_all(exp.Column):
        name, qualifier = column.name.lower(), column.table.lower()
        if isinstance(column.this, exp.Star):  # t.*
            if qualifier and qualifier not in derived:
                items |= all_columns(aliases.get(qualifier, qualifier))
            continue
        if not name:
            continue
        if qualifier:
            if qualifier not in derived:
                items.add(f"{aliases.get(qualifier, qualifier)}.{name}")
            continue
        owners = [t for t in sorted(tables) if name in columns_of.get(t, ())]
        if not owners and not columns_of and len(tables) == 1:
            owners = list(tables)
        if not owners and columns_of and not _is_output_alias(tree, name):
            owners = ["?"]
        items.update(f"{owner}.{name}" for owner in owners)
    return items


def _is_output_alias(tree: exp.Expression, name: str) -> bool:
    """True when ``name`` is an alias a SELECT gives an output column (``ORDER BY total``): not a schema item."""
    return any(alias.alias.lower() == name for alias in tree.find_all(exp.Alias))


def jaccard(a: set[str], b: set[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def schema_linking_score(
    pred_sql: str, gold_sql: str, schema: Mapping[str, Iterable[str]] | None = None
) -> float:
    pred, gold = parse_query(pred_sql), parse_query(gold_sql)
    if pred is None or gold is None:
        return 0.0
    return jaccard(schema_items(pred, schema), schema_items(gold, schema))


def _bigrams(sql: str) -> set[str]:
    tokens = sql.lower().split()
    if len(tokens) < 2:
        return set(tokens)
    return {f"{a} {b}" for a, b in itertools.pairwise(tokens)}


def ngram_score(pred_sql: str, gold_sql: str) -> float:
    if not pred_sql.strip():
        return 0.0
    return jaccard(_bigrams(pred_sql), _bigrams(gold_sql))


def skyrl_format(chat: str) -> bool:
    """SkyRL-SQL's format check on the whole chat (the policy's turns and the observations, concatenated):
    exactly one ``<solution>`` with one ``</solution>`` after it and no think/sql/observation tag inside, at
    least one ``<think>...</think>``, and after every ``</observation>`` the text starts with ``<think>``."""
    if chat.count("<solution>") != 1:
        return False
    before, tail = chat.split("<solution>", 1)
    if tail.count("</solution>") != 1 or _SOLUTION_INNER_TAGS.search(tail.split("</solution>", 1)[0]):
        return False
    if not re.search(r"<think>(.*?)</think>", chat, re.DOTALL):
        return False
    return all(
        before[match.end() :].lstrip().lower().startswith("<think>")
        for match in re.finditer(r"</observation>", before, re.IGNORECASE)
    )


def thinks_before_action(turn: str, action_tag: str) -> bool:
    """True when the turn has a complete ``<think>`` block that closes before its action tag opens."""
    think_open = turn.find("<think>")
    think_close = turn.find("</think>", think_open + 1) if think_open >= 0 else -1
    action = turn.find(f"<{action_tag}>")
    return 0 <= think_open < think_close < action
