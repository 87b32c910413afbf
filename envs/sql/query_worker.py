"""The query worker: a small standalone process that runs untrusted SQL where it can be stopped.

Started by ``workers.py`` as ``python -I -S query_worker.py PARENT_PID``; it loads ``sqlite_guard.py`` by file path and
imports nothing else but the standard library (importing ``rl_llm`` would cost a quarter second and 40 MB per
worker). It serves requests one at a time over its stdin/stdout pipes, each frame an 8-byte big-endian length
and a pickle:

- request: ``(path, max_sql_chars, max_value_bytes, sql, timeout_s, max_rows, max_bytes)``;
- answer: ``(columns, rows, error, timed_out, truncated, seconds)`` of plain values only.

It keeps the last few connections open (one per database file and set of connection limits) so queries do not
reopen the file. It exits when its stdin closes (the parent closed it or exited) and, since a worker stuck in
one long built-in call reads no stdin, also when its parent process is gone.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import signal
import sqlite3
import struct
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, BinaryIO

HEADER = struct.Struct("!Q")
MAX_CONNECTIONS = 16
# How often the watchdog looks for the parent (a worker orphaned mid-query exits within this).
PARENT_CHECK_S = 0.5


def load_guard() -> Any:
    path = Path(__file__).with_name("sqlite_guard.py")
    spec = importlib.util.spec_from_file_location("_rl_llm_sqlite_guard", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building the classes
    spec.loader.exec_module(module)
    return module


def read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    data = stream.read(size)
    return data if data is not None and len(data) == size else None


def watch_parent(parent: int) -> None:
    # The main thread may sit in one SQLite call for hours (sqlite3 releases the GIL there), so this thread
    # ends the process when the parent is gone and nobody will ever read the answer. The parent's pid comes
    # on the command line: one that died while this started up must not be mistaken for the adoptive one.
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)


class Connections:
    """Open guarded connections by (file, limits), the most recently used kept; reopened when the file at
    the path is replaced, so a query never reads a deleted file's old contents."""

    def __init__(self, guard: Any) -> None:
        self.guard = guard
        self._open: OrderedDict[tuple[str, int, int], tuple[tuple[int, int], Any]] = OrderedDict()

    def get(self, path: str, max_sql_chars: int, max_value_bytes: int) -> Any:
        key = (path, max_sql_chars, max_value_bytes)
        stat = os.stat(path)
        identity = (stat.st_dev, stat.st_ino)
        entry = self._open.pop(key, None)
        if entry is not None and entry[0] != identity:
            entry[1].close()
            entry = None
        if entry is None:
            entry = (identity, self.guard.GuardedConnection(path, max_sql_chars=max_sql_chars,
                                                            max_value_bytes=max_value_bytes))
        self._open[key] = entry
        while len(self._open) > MAX_CONNECTIONS:
            self._open.popitem(last=False)[1][1].close()
        return entry[1]


def answer(guard: Any, connections: Connections, request: tuple[Any, ...]) -> tuple[Any, ...]:
    path, max_sql_chars, max_value_bytes, sql, timeout_s, max_rows, max_bytes = request
    limits = guard.QueryLimits(timeout_s=timeout_s, max_rows=max_rows, max_bytes=max_bytes)
    try:
        connection = connections.get(path, max_sql_chars, max_value_bytes)
    except (OSError, sqlite3.Error) as exc:
        return [], [], f"{type(exc).__name__}: {exc}", False, False, 0.0
    result = connection.execute(sql, limits)
    return result.columns, result.rows, result.error, result.timed_out, result.truncated, result.seconds


def serve(requests: BinaryIO, answers: BinaryIO) -> None:
    guard = load_guard()
    connections = Connections(guard)
    while (header := read_exactly(requests, HEADER.size)) is not None:
        body = read_exactly(requests, HEADER.unpack(header)[0])
        if body is None:
            return
        data = pickle.dumps(answer(guard, connections, pickle.loads(body)), protocol=pickle.HIGHEST_PROTOCOL)
        answers.write(HEADER.pack(len(data)) + data)
        answers.flush()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal is for the parent, which closes us
    threading.Thread(target=watch_parent, args=(int(sys.argv[1]),), daemon=True).start()
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything else printed goes to stderr, never into the answer stream
    serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
