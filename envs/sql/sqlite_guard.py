"""The guards around one SQLite connection that runs untrusted SQL; standard library only.

This module runs inside the query worker (``query_worker.py``, loaded by file path so the worker never imports
``rl_llm``) and must keep importing nothing but the standard library. ``database.py`` re-exports its public
names for the parent process.

Untrusted SQL (an LLM's queries) runs behind four independent guards, so one mistake does not open the file:

1. the connection is opened with the URI ``mode=ro`` (SQLite itself refuses every write to the file);
2. ``PRAGMA query_only`` is switched on;
3. an authorizer allows only reading: SELECT, reads of tables and columns, recursive CTEs, functions other
   than extension loading, and a few read-only PRAGMAs without arguments. Writes, schema changes, ATTACH,
   DETACH, transactions, VACUUM's attach and PRAGMA writes are refused while the statement is prepared;
4. connection limits: no attached databases, bounded SQL text and string/blob length.

A progress handler aborts any statement (including row fetching) past ``timeout_s``; results stop at
``max_rows`` rows or ``max_bytes`` bytes and say they were truncated. The progress handler runs only between
SQLite's virtual-machine instructions, so one slow built-in call can overrun it; the parent process's hard
deadline on the worker (``workers.py``) covers that case.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

# How an authorizer refusal reads, naming the check that refused; database.py names the statement instead where
# that check is an inner one (VACUUM's ATTACH), with the same words.
REFUSAL = "refused: the database is read-only and only queries run here ({} is not allowed)"

# PRAGMAs that only describe the schema; every other PRAGMA (reads included) is refused.
READ_ONLY_PRAGMAS = frozenset({
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo", "foreign_key_list",
})  # fmt: skip
DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"})
_ALWAYS_ALLOWED = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE})
# Authorizer action codes (sqlite3.h), named for refusal messages.
_ACTION_NAMES = dict(enumerate((
    "", "create index", "create table", "create temp index", "create temp table", "create temp trigger",
    "create temp view", "create trigger", "create view", "delete from", "drop index", "drop table",
    "drop temp index", "drop temp table", "drop temp trigger", "drop temp view", "drop trigger", "drop view",
    "insert into", "pragma", "read", "select", "transaction", "update", "attach", "detach", "alter table",
    "reindex", "analyze", "create virtual table", "drop virtual table", "function", "savepoint", "recursive",
)))  # fmt: skip
# How SQLite words an authorizer refusal (functions, other statements, VACUUM's nested ATTACH).
_DENIED_MESSAGES = ("not authorized", "authorization denied")
# Instructions between progress-handler calls: small enough to stop within milliseconds of the deadline.
PROGRESS_INTERVAL = 2000
# Rough per-cell size of numbers and NULL when counting result bytes.
_SCALAR_BYTES = 8


@dataclass(frozen=True)
class QueryLimits:
    """Limits on one query: wall time, result rows and result bytes (text and blobs by length)."""

    timeout_s: float = 5.0
    max_rows: int = 10_000
    max_bytes: int = 8 << 20

    def __post_init__(self) -> None:
        # Finite and bounded: infinity or 1e30 passed "> 0" and overflowed the deadline's clock in the first query.
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) \
                or not 0 < self.timeout_s <= 1_000_000:
            raise ValueError(f"timeout_s must be a positive number of seconds up to 1,000,000, got {self.timeout_s!r}")
        for name, value in (("max_rows", self.max_rows), ("max_bytes", self.max_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass
class QueryResult:
    """Rows of one query, or why there are none. ``truncated`` means a row or byte cap cut the rows short."""

    columns: list[str] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    error: str | None = None
    timed_out: bool = False
    truncated: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


class QueryRefused(Exception):
    """Raised for SQL the guard refuses before SQLite sees it."""


class GuardedConnection:
    """One SQLite file opened for untrusted read-only queries, behind all four guards.

    ``max_sql_chars`` bounds the query text, ``max_value_bytes`` any single string or blob a query builds.
    """

    def __init__(self, path: str | Path, *, max_sql_chars: int = 20_000, max_value_bytes: int = 8 << 20) -> None:
        self.path = Path(path)
        self.max_sql_chars = max_sql_chars
        self._denial: str | None = None
        self._deadline = 0.0
        uri = f"file:{quote(str(self.path.resolve()))}?mode=ro"
        self._connection = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
        self._connection.execute("PRAGMA query_only = ON")
        for limit, value in (
            (sqlite3.SQLITE_LIMIT_ATTACHED, 0),
            (sqlite3.SQLITE_LIMIT_SQL_LENGTH, max_sql_chars * 4 + 64),  # bytes of UTF-8, so up to 4 per char
            (sqlite3.SQLITE_LIMIT_LENGTH, max_value_bytes),
        ):
            self._connection.setlimit(limit, value)
        self._connection.text_factory = _decode_text
        self._connection.set_authorizer(self._authorize)
        self._connection.set_progress_handler(self._past_deadline, PROGRESS_INTERVAL)

    # -- guards ------------------------------------------------------------------------------------------
    def _authorize(
        self, action: int, arg1: str | None, arg2: str | None, _db: str | None, _trigger: str | None
    ) -> int:
        if action in _ALWAYS_ALLOWED:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() not in DENIED_FUNCTIONS:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in READ_ONLY_PRAGMAS:
            return sqlite3.SQLITE_OK  # their argument names a table or index to describe, never a value to set
        what = _ACTION_NAMES.get(action, f"action {action}")
        target = arg2 if action == sqlite3.SQLITE_FUNCTION else arg1
        # CREATE/DROP are refused at their first check, a write to the schema table.
        schema_change = (arg1 or "").lower() in ("sqlite_master", "sqlite_temp_master", "sqlite_schema")
        self._denial = "changing the schema" if schema_change else f"{what}{f' {target}' if target else ''}"
        return sqlite3.SQLITE_DENY

    def _past_deadline(self) -> int:
        return int(time.monotonic() > self._deadline)

    # -- queries -----------------------------------------------------------------------------------------
    def execute(self, sql: str, limits: QueryLimits) -> QueryResult:
        """Run one statement under ``limits``. Never raises for bad SQL: the result carries the error."""
        start = time.monotonic()
        self._denial = None
        self._deadline = start + limits.timeout_s
        result = QueryResult()
        cursor = None
        try:
            check_text(sql, self.max_sql_chars)
            cursor = self._connection.execute(sql)
            result.columns = [column[0] for column in cursor.description or ()]
            result.rows, result.truncated = _fetch_capped(cursor, limits)
        except QueryRefused as exc:
            result.error = str(exc)
        except (sqlite3.Error, sqlite3.Warning, OverflowError, MemoryError, ValueError) as exc:
            result.error, result.timed_out = self._describe(exc, limits)
        finally:
            if cursor is not None:
                cursor.close()
            result.seconds = time.monotonic() - start
        if not result.ok:
            result.rows, result.columns = [], []
        return result

    def _describe(self, exc: BaseException, limits: QueryLimits) -> tuple[str, bool]:
        message = str(exc)
        if isinstance(exc, sqlite3.OperationalError) and message == "interrupted":
            return f"query timed out after {limits.timeout_s:g} s and was stopped", True
        if isinstance(exc, sqlite3.DatabaseError) and message.startswith(_DENIED_MESSAGES):
            denied = self._denial or "this statement"
            return REFUSAL.format(denied), False
        if isinstance(exc, sqlite3.ProgrammingError) and "one statement at a time" in message:
            return "refused: submit exactly one SQL statement (no ';'-separated scripts)", False
        return f"{type(exc).__name__}: {message}", False

    def close(self) -> None:
        self._connection.close()


def _decode_text(raw: bytes) -> str:
    # Databases in the wild hold invalid UTF-8; show it rather than fail the query.
    return raw.decode("utf-8", errors="replace")


def check_text(sql: str, max_chars: int) -> None:
    if not isinstance(sql, str):
        raise QueryRefused(f"refused: SQL must be text, got {type(sql).__name__}")
    if not sql.strip():
        raise QueryRefused("refused: the SQL statement is empty")
    if len(sql) > max_chars:
        raise QueryRefused(f"refused: the SQL statement has {len(sql)} characters, over the limit of {max_chars}")
    if "\x00" in sql:
        raise QueryRefused("refused: the SQL statement contains a NUL character")


def _cell_bytes(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes)) else _SCALAR_BYTES


def _fetch_capped(cursor: sqlite3.Cursor, limits: QueryLimits) -> tuple[list[tuple[Any, ...]], bool]:
    rows: list[tuple[Any, ...]] = []
    size = 0
    for row in cursor:
        size += sum(_cell_bytes(value) for value in row)
        if len(rows) >= limits.max_rows or size > limits.max_bytes:
            return rows, True
        rows.append(row)
    return rows, False
