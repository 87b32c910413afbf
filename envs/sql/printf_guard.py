"""SQLite's ``printf``/``format`` with one slow case taken out.

SQLite up to at least 3.40 (the one Python links on Debian 12) writes a ``%c`` conversion's precision one
character at a time, inside a single function call: ``printf('%.*c', 2000000000, 'x')`` ran 11-16 s on the
2-core machine, and the progress handler that enforces a query's timeout is only called between the virtual
machine's instructions, never inside a function, so the 5 s timeout did not hold. The result past the
string-length limit is NULL anyway. So the two names are replaced, on the query connection, by a function that
answers NULL at once when a ``%c`` precision passes that limit and otherwise hands the call, unchanged, to
SQLite's own ``printf`` on a private in-memory connection (the same result, a few microseconds more per call).
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

# %[flags][width][.precision][length]conversion, as SQLite's printf reads it (sqlite3/src/printf.c).
_CONVERSION = re.compile(r"%[-+ #0,!]*(\*|\d*)(?:\.(\*|\d*))?(?:ll|l)?(.)", re.DOTALL)


def install_printf_guard(connection: sqlite3.Connection, max_value_bytes: int) -> None:
    """Replace ``printf`` and ``format`` on ``connection`` (see the module docstring)."""
    private = sqlite3.connect(":memory:", check_same_thread=False)
    private.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_value_bytes)

    def printf(*args: Any) -> Any:
        if not args or _slow_char_repeat(args, max_value_bytes):
            return None  # SQLite's own answer for both (no format; a result over the length limit)
        placeholders = ", ".join("?" * len(args))
        return private.execute(f"SELECT printf({placeholders})", args).fetchone()[0]

    for name in ("printf", "format"):
        connection.create_function(name, -1, printf, deterministic=True)


def _slow_char_repeat(args: tuple[Any, ...], limit: int) -> bool:
    """Whether a ``%c`` conversion of the format ``args[0]`` repeats its character more than ``limit`` times."""
    fmt = args[0]
    if isinstance(fmt, bytes):
        fmt = fmt.decode("utf-8", "replace")
    if not isinstance(fmt, str) or "%" not in fmt:
        return False
    position = 1  # the next argument a conversion (or a '*') takes
    for width, precision, conversion in _CONVERSION.findall(fmt):
        if conversion == "%":
            continue
        position += width == "*"
        if precision == "*":
            value = args[position] if position < len(args) else 0
            precision, position = str(int(value) if isinstance(value, int | float) else 0), position + 1
        if conversion == "c" and precision.lstrip("-").isdigit() and abs(int(precision)) > limit:
            return True
        position += 1
    return False
