"""Scoring a predicted query against a task's gold query: open databases, cached gold results, rewards."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rl_llm.envs.sql.database import QueryLimits, QueryResult, ReadOnlyDatabase
from rl_llm.envs.sql.render import schema_columns
from rl_llm.envs.sql.results import has_top_level_order_by, results_match, sets_match
from rl_llm.envs.sql.rewards import jaccard, ngram_score, parse_query, schema_items
from rl_llm.envs.sql.tasks import SqlTask


class DatabasePool:
    """Read-only connections by file, the ``max_open`` most recently used kept open."""

    def __init__(self, max_open: int = 8, max_sql_chars: int = 20_000) -> None:
        self.max_open = max_open
        self.max_sql_chars = max_sql_chars
        self._open: OrderedDict[Path, ReadOnlyDatabase] = OrderedDict()

    def get(self, path: Path) -> ReadOnlyDatabase:
        database = self._open.pop(path, None)
        if database is None:
            database = ReadOnlyDatabase(path, max_sql_chars=self.max_sql_chars)
        self._open[path] = database
        while len(self._open) > self.max_open:
            self._open.popitem(last=False)[1].close()
        return database

    def close(self) -> None:
        while self._open:
            self._open.popitem()[1].close()


@dataclass(frozen=True)
class GoldResult:
    result: QueryResult
    ordered: bool

    @property
    def usable(self) -> bool:
        return self.result.ok and not self.result.truncated


class GoldCache:
    """Gold results shared by every scorer in the process (envs of one rollout batch see the same tasks).

    Keyed by database file (path, size, modification time) and gold SQL, so a changed file is re-queried.
    """

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[object, ...], GoldResult] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(task: SqlTask) -> tuple[object, ...]:
        stat = task.db_path.stat()
        return (str(task.db_path.resolve()), stat.st_size, stat.st_mtime_ns, task.gold_sql)

    def get(self, key: tuple[object, ...]) -> GoldResult | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: tuple[object, ...], value: GoldResult) -> None:
        with self._lock:
            self._entries[key] = value
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


GOLD_CACHE = GoldCache()


@dataclass
class Scores:
    """Raw reward terms in [0, 1] for one prediction, and what its execution returned."""

    values: dict[str, float]
    predicted: QueryResult | None = None
    gold: GoldResult | None = None
    notes: list[str] = field(default_factory=list)


class SqlScorer:
    """Executes predictions and gold queries under limits and computes the reward terms asked for."""

    def __init__(
        self,
        *,
        limits: QueryLimits,
        gold_limits: QueryLimits,
        tolerance: float = 1e-6,
        cache_gold: bool = True,
        pool: DatabasePool | None = None,
        cache: GoldCache = GOLD_CACHE,
        result_match: str = "multiset",
    ) -> None:
        if result_match not in ("multiset", "set"):
            raise ValueError(f"result_match must be 'multiset' or 'set', got {result_match!r}")
        self.result_match = result_match
        self.limits = limits
        self.gold_limits = gold_limits
        self.tolerance = tolerance
        self.cache_gold = cache_gold
        self.pool = pool or DatabasePool()
        self.cache = cache
        self._columns: dict[Path, dict[str, list[str]]] = {}
        self._gold_schema_items: dict[tuple[Path, str], set[str] | None] = {}

    def run(self, task: SqlTask, sql: str) -> QueryResult:
        return self.pool.get(task.db_path).execute(sql, self.limits)

    def gold(self, task: SqlTask) -> GoldResult:
        key = self.cache.key(task) if self.cache_gold else None
        cached = self.cache.get(key) if key is not None else None
        if cached is not None:
            return cached
        result = self.pool.get(task.db_path).execute(task.gold_sql, self.gold_limits)
        gold = GoldResult(result, has_top_level_order_by(task.gold_sql))
        if key is not None:
            self.cache.put(key, gold)
        return gold

    def _gold_items(self, task: SqlTask) -> set[str] | None:
        key = (task.db_path, task.gold_sql)
        if key not in self._gold_schema_items:
            tree = parse_query(task.gold_sql)
            self._gold_schema_items[key] = None if tree is None else schema_items(tree, self.columns(task))
        return self._gold_schema_items[key]

    def columns(self, task: SqlTask) -> dict[str, list[str]]:
        if task.db_path not in self._columns:
            self._columns[task.db_path] = schema_columns(self.pool.get(task.db_path), self.gold_limits)
        return self._columns[task.db_path]

    def execution(self, task: SqlTask, sql: str) -> Scores:
        """Execution match only: 1.0 when the prediction's rows equal the gold rows."""
        predicted = self.run(task, sql)
        gold = self.gold(task)
        scores = Scores({"execution": 0.0}, predicted, gold)
        if not gold.usable:
            problem = gold.result.error or "result too large"
            scores.notes.append(f"the gold query of {task.task_id} failed: {problem}")
        elif not predicted.ok:
            scores.notes.append(f"your query failed: {predicted.error}")
        elif predicted.truncated:
            scores.notes.append("your query returned more rows than the result limit")
        elif self._matches(predicted, gold):
            scores.values["execution"] = 1.0
        return scores

    def _matches(self, predicted: QueryResult, gold: GoldResult) -> bool:
        if self.result_match == "set":
            return sets_match(predicted.rows, gold.result.rows)
        return results_match(predicted.rows, gold.result.rows, ordered=gold.ordered, tolerance=self.tolerance)

    def score(self, task: SqlTask, sql: str, terms: Mapping[str, float] | None = None) -> Scores:
        """Execution match plus the partial terms named in ``terms`` (format terms are the env's).

        The partial terms are 0 unless the prediction executes: Reasoning-SQL's syntax term is "executes
        without error", and a query that fails must not collect schema-linking or n-gram credit that puts it
        above a query that runs and is wrong.
        """
        scores = self.execution(task, sql)
        wanted = set(terms or ()) & {"syntax", "schema_linking", "ngram"}
        runs = scores.predicted is not None and scores.predicted.ok
        if not runs:
            scores.values.update(dict.fromkeys(wanted, 0.0))
            return scores
        if wanted & {"syntax", "schema_linking"}:
            tree = parse_query(sql)  # parsed once for both terms
            if "syntax" in wanted:
                scores.values["syntax"] = float(tree is not None)
            if "schema_linking" in wanted:
                gold_items = self._gold_items(task)
                linked = tree is not None and gold_items is not None
                scores.values["schema_linking"] = (
                    jaccard(schema_items(tree, self.columns(task)), gold_items) if linked else 0.0
                )
        if "ngram" in wanted:
            scores.values["ngram"] = ngram_score(sql, task.gold_sql)
        return scores

    def close(self) -> None:
        self.pool.close()
