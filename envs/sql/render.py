"""Text the agent reads: the schema (CREATE TABLE statements with sample rows) and query results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rl_llm.envs.sql.database import QueryLimits, QueryResult, ReadOnlyDatabase

# Longest cell shown; longer values end in "...".
MAX_CELL_CHARS = 80


def quote_identifier(name: str) -> str:
    """A table name as a double-quoted SQL identifier (inner double quotes doubled), whatever it holds."""
    return '"' + name.replace('"', '""') + '"'


def format_cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        text = f"x'{value[: MAX_CELL_CHARS // 2].hex()}'"
    elif isinstance(value, float):
        text = repr(value)
    else:
        text = str(value)
    text = text.replace("\n", "\\n").replace("\r", "\\r").replace("|", "\\|")
    return text if len(text) <= MAX_CELL_CHARS else text[: MAX_CELL_CHARS - 3] + "..."


def format_rows(columns: Sequence[str], rows: Sequence[tuple[Any, ...]], max_chars: int) -> tuple[str, int]:
    """A pipe-separated table of as many leading rows as fit in ``max_chars``; returns (text, rows shown)."""
    lines = [" | ".join(format_cell(c) for c in columns)]
    size = len(lines[0])
    shown = 0
    for row in rows:
        line = " | ".join(format_cell(value) for value in row)
        if size + len(line) + 1 > max_chars and shown > 0:
            break
        lines.append(line)
        size += len(line) + 1
        shown += 1
    return "\n".join(lines), shown


def format_result(result: QueryResult, max_rows: int, max_chars: int) -> str:
    """The observation text of one exploratory query."""
    if not result.ok:
        return f"Error: {result.error}"
    if not result.columns:
        return "The statement returned no columns."
    if not result.rows:
        return "The query returned no rows.\n" + " | ".join(format_cell(c) for c in result.columns)
    table, shown = format_rows(result.columns, result.rows[:max_rows], max_chars)
    total = f"at least {len(result.rows)}" if result.truncated else str(len(result.rows))
    if shown < len(result.rows) or result.truncated:
        return f"Showing the first {shown} of {total} rows.\n{table}"
    return f"{shown} row{'s' if shown != 1 else ''}.\n{table}"


def describe_schema(database: ReadOnlyDatabase, sample_rows: int, limits: QueryLimits) -> str:
    """Every table's CREATE statement, each followed by up to ``sample_rows`` example rows in a comment."""
    statements = database.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid",
        limits,
    )
    if not statements.ok:
        raise RuntimeError(f"cannot read the schema of {database.path}: {statements.error}")
    parts = []
    for name, create in statements.rows:
        text = (create or f"CREATE TABLE {name} (...)").strip().rstrip(";") + ";"
        if sample_rows > 0:
            sample = database.execute(f"SELECT * FROM {quote_identifier(name)} LIMIT {int(sample_rows)}", limits)
            if sample.ok and sample.rows:
                table, _ = format_rows(sample.columns, sample.rows, max_chars=4000)
                table = table.replace("*/", "* /")  # a value must not close the comment
                text += f"\n/* {len(sample.rows)} example rows of {name}:\n{table}\n*/"
        parts.append(text)
    return "\n\n".join(parts)


def schema_columns(database: ReadOnlyDatabase, limits: QueryLimits) -> dict[str, list[str]]:
    """Table -> column names, for attributing unqualified columns in schema-linking rewards."""
    columns: dict[str, list[str]] = {}
    for name in database.table_names():
        info = database.execute(f"PRAGMA table_info({quote_identifier(name)})", limits)
        columns[name] = [row[1] for row in info.rows]
    return columns
