"""Read-only, time- and size-limited access to a SQLite database file, each query run in a worker process.

Untrusted SQL (an LLM's queries) runs behind four independent guards, so one mistake does not open the file
(``sqlite_guard.py``): a ``mode=ro`` URI, ``PRAGMA query_only``, an authorizer that allows only reading, and
connection limits. Its progress handler stops a statement past ``timeout_s``; results stop at ``max_rows``
rows or ``max_bytes`` bytes and say they were truncated.

The progress handler cannot stop one slow built-in call (``trim``, ``instr``, ``LIKE`` or ``printf`` on
megabyte strings can run for hours), so the guarded connection lives in a query worker process
(``query_worker.py``, standard library only) from a pool shared by every database of the process
(``workers.py``). A normal timeout comes back from the worker; past the hard deadline (``timeout_s`` plus a
grace of ``max(1 s, 0.25 * timeout_s)``) the worker is killed and the result is the same timed-out result.
"""

from __future__ import annotations

import re
import time
import weakref
from pathlib import Path

from rl_llm.envs.sql.sqlite_guard import (
    DENIED_FUNCTIONS,
    READ_ONLY_PRAGMAS,
    REFUSAL,
    QueryLimits,
    QueryRefused,
    QueryResult,
    check_text,
)
from rl_llm.envs.sql.workers import POOL, WorkerGone

__all__ = ["DENIED_FUNCTIONS", "READ_ONLY_PRAGMAS", "QueryLimits", "QueryRefused", "QueryResult",
           "ReadOnlyDatabase"]  # fmt: skip

# How the guard words an authorizer refusal (sqlite_guard.py, GuardedConnection._describe), naming the check
# that refused. For these statements that check is not the statement: VACUUM is refused at the ATTACH it runs
# internally (it read "attach is not allowed"), ALTER TABLE names the database ("alter table main"), REINDEX
# and ANALYZE the first index or table they reach. The guard runs in the worker and stays as it is; the
# parent names the statement instead, in the guard's words (``REFUSAL``).
_REFUSAL_HEAD = REFUSAL.partition("{")[0]
_STATEMENTS_NAMED_BY_KEYWORD = {"VACUUM": "VACUUM", "ALTER": "ALTER TABLE", "REINDEX": "REINDEX", "ANALYZE": "ANALYZE"}
# The savepoint check names the operation ("savepoint BEGIN" is a SAVEPOINT statement).
_SAVEPOINT_CHECKS = {"savepoint BEGIN": "SAVEPOINT", "savepoint RELEASE": "RELEASE SAVEPOINT",
                     "savepoint ROLLBACK": "ROLLBACK TO SAVEPOINT"}  # fmt: skip
# Whitespace and comments before a statement's first keyword.
_LEADING = re.compile(r"(?:\s+|--[^\n]*|/\*.*?(?:\*/|\Z))*", re.DOTALL)
_KEYWORD = re.compile(r"[A-Za-z]+")

_CATALOG_SQL = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid"


class ReadOnlyDatabase:
    """One SQLite file opened for untrusted read-only queries. Safe to call from several threads at once.

    ``max_sql_chars`` bounds the query text, ``max_value_bytes`` any single string or blob a query builds.
    """

    def __init__(self, path: str | Path, *, max_sql_chars: int = 20_000, max_value_bytes: int = 8 << 20) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no SQLite database at {self.path}")
        self.max_sql_chars = max_sql_chars
        self.max_value_bytes = max_value_bytes
        self._resolved = str(self.path.resolve())
        POOL.register()
        # Unregisters once, at close() or when the database is garbage-collected unclosed.
        self._release = weakref.finalize(self, POOL.unregister)

    def execute(self, sql: str, limits: QueryLimits) -> QueryResult:
        """Run one statement under ``limits``. Never raises for bad SQL: the result carries the error."""
        start = time.monotonic()
        result = QueryResult()
        try:
            check_text(sql, self.max_sql_chars)  # here too, so refused text never travels to a worker
            if not self._release.alive:
                raise QueryRefused("ProgrammingError: Cannot operate on a closed database.")
            result = self._run(sql, limits, start)
            result.error = name_refused_statement(sql, result.error)
        except QueryRefused as exc:
            result.error = str(exc)
        result.seconds = result.seconds or time.monotonic() - start
        return result

    def _run(self, sql: str, limits: QueryLimits, start: float) -> QueryResult:
        request = (self._resolved, self.max_sql_chars, self.max_value_bytes, sql, limits.timeout_s,
                   limits.max_rows, limits.max_bytes)  # fmt: skip
        try:
            answer = POOL.run(request, limits.timeout_s)
        except WorkerGone as exc:
            return QueryResult(error=str(exc))
        if answer is None:  # killed at the hard deadline: the same result as the worker's own timeout
            message = f"query timed out after {limits.timeout_s:g} s and was stopped"
            return QueryResult(error=message, timed_out=True, seconds=time.monotonic() - start)
        columns, rows, error, timed_out, truncated, seconds = answer
        return QueryResult(list(columns), list(rows), error, timed_out, truncated, seconds)

    def table_names(self) -> list[str]:
        result = self.execute(_CATALOG_SQL, QueryLimits())
        if not result.ok:
            raise RuntimeError(f"cannot list the tables of {self.path}: {result.error}")
        return [row[0] for row in result.rows]

    def close(self) -> None:
        self._release()

    def __enter__(self) -> ReadOnlyDatabase:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def first_keyword(sql: str) -> str:
    """The first word of a statement, upper case, after whitespace and comments ("" when there is none)."""
    keyword = _KEYWORD.match(sql, _LEADING.match(sql).end())
    return keyword[0].upper() if keyword else ""


def name_refused_statement(sql: str, error: str | None) -> str | None:
    """``error`` with the refused statement named where the guard names an inner check instead."""
    if error is None or not error.startswith(_REFUSAL_HEAD):
        return error
    check = error[len(_REFUSAL_HEAD) :].removesuffix(" is not allowed)")
    statement = _STATEMENTS_NAMED_BY_KEYWORD.get(first_keyword(sql)) or _SAVEPOINT_CHECKS.get(check)
    return REFUSAL.format(statement) if statement else error
