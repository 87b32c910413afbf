"""Hostile SQL against TextToSQL: refused or stopped by the timeout, with a clear observation, and the
database file byte-identical afterwards."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gymnasium as gym
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rl_llm  # noqa: F401
from rl_llm.envs.sql.database import QueryLimits, ReadOnlyDatabase
from rl_llm.envs.sql.tasks import CHINOOK_DB

TIMEOUT_S = 0.3


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def chinook_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy, so the ATTACH/VACUUM targets and any stray journal would land next to it."""
    path = tmp_path_factory.mktemp("db") / "chinook.sqlite"
    shutil.copyfile(CHINOOK_DB, path)
    return path


def refused(outside: Path) -> list[tuple[str, str]]:
    return [
        ("DROP TABLE Track", "changing the schema is not allowed"),
        ("DELETE FROM Track", "delete from Track is not allowed"),
        ("UPDATE Track SET Name = 'x'", "update Track is not allowed"),
        ("INSERT INTO Genre (GenreId, Name) VALUES (99, 'x')", "insert into Genre is not allowed"),
        ("REPLACE INTO Genre VALUES (1, 'x')", "insert into Genre is not allowed"),
        ("CREATE TABLE evil (x)", "changing the schema is not allowed"),
        ("CREATE TEMP TABLE evil (x)", "changing the schema is not allowed"),
        ("ALTER TABLE Genre ADD COLUMN y", "(ALTER TABLE is not allowed)"),
        (f"ATTACH DATABASE '{outside / 'attached.db'}' AS evil", f"(attach {outside / 'attached.db'} is not allowed)"),
        # Each statement is named: VACUUM read "attach is not allowed" (the guard refuses its inner ATTACH),
        # SAVEPOINT "savepoint BEGIN", REINDEX and ANALYZE the first index or table they reached.
        (f"VACUUM INTO '{outside / 'copy.db'}'", "(VACUUM is not allowed)"),
        ("VACUUM", "(VACUUM is not allowed)"),
        ("/* tidy up */ vacuum main", "(VACUUM is not allowed)"),
        ("DETACH DATABASE main", "(detach main is not allowed)"),
        ("REINDEX", "(REINDEX is not allowed)"),
        ("REINDEX Track", "(REINDEX is not allowed)"),
        ("-- statistics\nANALYZE", "(ANALYZE is not allowed)"),
        ("SAVEPOINT s", "(SAVEPOINT is not allowed)"),
        ("RELEASE s", "(RELEASE SAVEPOINT is not allowed)"),
        ("ROLLBACK TO s", "(ROLLBACK TO SAVEPOINT is not allowed)"),
        ("COMMIT", "(transaction COMMIT is not allowed)"),
        ("DROP INDEX IFK_TrackAlbumId", "(changing the schema is not allowed)"),
        ("PRAGMA writable_schema = ON", "pragma writable_schema is not allowed"),
        ("PRAGMA journal_mode = WAL", "pragma journal_mode is not allowed"),
        ("PRAGMA query_only = OFF", "pragma query_only is not allowed"),
        ("SELECT load_extension('/tmp/libevil.so')", "function load_extension is not allowed"),
        ("BEGIN IMMEDIATE", "(transaction BEGIN is not allowed)"),
        ("SELECT 1; DROP TABLE Track", "exactly one SQL statement"),
        ("SELECT zeroblob(100000000)", "too big"),
    ]


ENDLESS = [
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
    "SELECT count(*) FROM Track a, Track b, Track c",
    "SELECT a.Name, b.TrackId FROM Track a, PlaylistTrack b ORDER BY a.Name || b.TrackId DESC LIMIT 1",
]


def test_hostile_statements_are_refused_and_the_file_is_unchanged(chinook_copy: Path) -> None:
    before = sha256(chinook_copy)
    outside = chinook_copy.parent
    with ReadOnlyDatabase(chinook_copy) as database:
        for sql, reason in refused(outside):
            result = database.execute(sql, QueryLimits(timeout_s=TIMEOUT_S))
            assert not result.ok and not result.timed_out, sql
            assert reason in result.error and result.rows == [], (sql, result.error)
        assert database.execute("SELECT COUNT(*) FROM Track", QueryLimits()).rows == [(3503,)]
    assert sha256(chinook_copy) == before
    assert sorted(p.name for p in outside.iterdir()) == ["chinook.sqlite"], "no journal, attached or copied file"


@pytest.mark.parametrize("sql", ENDLESS)
def test_endless_queries_are_stopped_by_the_timeout(chinook_copy: Path, sql: str) -> None:
    before = sha256(chinook_copy)
    with ReadOnlyDatabase(chinook_copy) as database:
        result = database.execute(sql, QueryLimits(timeout_s=TIMEOUT_S))
        assert result.timed_out and f"timed out after {TIMEOUT_S:g} s" in result.error
        # The connection stays usable after an interrupted statement.
        assert database.execute("SELECT COUNT(*) FROM Genre", QueryLimits()).rows == [(25,)]
    assert sha256(chinook_copy) == before


def test_row_and_byte_caps_truncate_results(chinook_copy: Path) -> None:
    with ReadOnlyDatabase(chinook_copy) as database:
        endless_rows = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT n FROM r"
        result = database.execute(endless_rows, QueryLimits(timeout_s=5, max_rows=100))
        assert result.ok and result.truncated and len(result.rows) == 100
        result = database.execute("SELECT Name FROM Track", QueryLimits(max_bytes=1000))
        assert result.truncated and 0 < len(result.rows) < 3503
        assert database.execute("SELECT Name FROM Genre", QueryLimits(max_rows=25)).truncated is False


def test_schema_pragmas_and_the_catalog_stay_readable(chinook_copy: Path) -> None:
    with ReadOnlyDatabase(chinook_copy) as database:
        info = database.execute("PRAGMA table_info(Genre)", QueryLimits())
        assert [row[1] for row in info.rows] == ["GenreId", "Name"]
        catalog = database.execute("SELECT name FROM sqlite_master WHERE type = 'table'", QueryLimits())
        assert ("Track",) in catalog.rows


def test_hostile_sql_through_the_env_gets_clear_observations(chinook_copy: Path) -> None:
    before = sha256(CHINOOK_DB)
    env = gym.make("rl-llm/TextToSQL-v0", query_timeout_s=TIMEOUT_S, max_turns=50).unwrapped
    env.reset(seed=0)
    for sql, reason in refused(chinook_copy.parent):
        observation, reward, terminated, truncated, _info = env.step(f"<think>x</think><sql>{sql}</sql>")
        assert reason in observation and observation.startswith("<observation>Error: ")
        assert reward == 0.0 and not (terminated or truncated)
    for sql in ENDLESS:
        observation, *_ = env.step(f"<sql>{sql}</sql>")
        assert "timed out" in observation
    assert env.step("<sql>SELECT 1</sql>")[4]["metrics"]["timeouts"] == len(ENDLESS)
    # Hostile SQL as the final answer scores 0 and says why.
    _, reward, terminated, _, _ = env.step("<solution>DELETE FROM Invoice</solution>")
    assert terminated and reward == 0.0 and "delete from Invoice is not allowed" in env.transcript
    env.close()
    assert sha256(CHINOOK_DB) == before


SQL_WORDS = ["SELECT", "*", "FROM", "Track", "WHERE", "DROP", "TABLE", "DELETE", "UPDATE", "SET", "INSERT", "INTO",
             "ATTACH", "PRAGMA", "writable_schema", "=", "ON", "1", "'x'", ";", "(", ")", ",", "VACUUM", "WITH",
             "RECURSIVE", "UNION", "ALL", "load_extension", "--", "/*", "\x00", "é"]  # fmt: skip


@given(words=st.lists(st.sampled_from(SQL_WORDS), max_size=14))
def test_random_sql_never_crashes_or_writes(chinook_copy: Path, words: list[str]) -> None:
    before = sha256(chinook_copy)
    with ReadOnlyDatabase(chinook_copy) as database:
        result = database.execute(" ".join(words), QueryLimits(timeout_s=TIMEOUT_S))
    assert result.ok or result.error
    assert sha256(chinook_copy) == before
    assert sorted(p.name for p in chinook_copy.parent.iterdir()) == ["chinook.sqlite"]


# --- single slow built-in calls: the progress handler never runs inside one, the worker is killed ---------
def _letters(letter: str, count: int) -> str:
    return f"replace(hex(zeroblob({count // 2})), '0', '{letter}')"  # `count` copies of `letter`, computed


# Each takes from tens of seconds to hours in-process on SQLite 3.40 (superlinear in the string lengths).
SLOW_BUILTINS = {
    "trim": f"SELECT length(trim({_letters('a', 160_000)} || 'c', {_letters('b', 80_000)} || 'a'))",
    "instr": f"SELECT instr({_letters('a', 2_560_000)} || 'b', {_letters('a', 640_000)} || 'b')",
    "like": f"SELECT {_letters('a', 480_000)} LIKE '%' || {_letters('a', 48_000)} || 'b%'",  # pattern limit 50k
    "printf": "SELECT length(printf('%.*c', 2000000000, 'x'))",
}
SLOW_TIMEOUT_S = 0.5
# The parent's hard deadline (timeout plus a 1 s grace) and generous slack for a loaded machine.
SLOW_BOUND_S = SLOW_TIMEOUT_S + 1.0 + 4.0


@pytest.mark.parametrize("name", sorted(SLOW_BUILTINS))
def test_one_slow_builtin_call_is_stopped_by_the_hard_deadline(chinook_copy: Path, name: str) -> None:
    before = sha256(chinook_copy)
    with ReadOnlyDatabase(chinook_copy) as database:
        start = time.monotonic()
        result = database.execute(SLOW_BUILTINS[name], QueryLimits(timeout_s=SLOW_TIMEOUT_S))
        assert time.monotonic() - start < SLOW_BOUND_S
        assert result.timed_out and result.error == f"query timed out after {SLOW_TIMEOUT_S:g} s and was stopped"
        assert result.rows == [] and result.columns == []
        assert database.execute("SELECT COUNT(*) FROM Genre", QueryLimits()).rows == [(25,)]
    assert sha256(chinook_copy) == before


def test_a_slow_builtin_through_the_env_times_out_and_the_episode_goes_on() -> None:
    env = gym.make("rl-llm/TextToSQL-v0", query_timeout_s=SLOW_TIMEOUT_S, max_turns=5).unwrapped
    env.reset(seed=0)
    start = time.monotonic()
    observation, _, terminated, truncated, _ = env.step(f"<sql>{SLOW_BUILTINS['trim']}</sql>")
    assert time.monotonic() - start < SLOW_BOUND_S
    assert "timed out after 0.5 s" in observation and not (terminated or truncated)
    observation, *_ = env.step("<sql>SELECT COUNT(*) FROM Genre</sql>")
    assert "25" in observation and "Error" not in observation
    env.close()


def test_other_callers_are_answered_while_one_query_hangs(chinook_copy: Path) -> None:
    """Env servers call one database from several threads: a hung query must not hold up the others."""
    with ReadOnlyDatabase(chinook_copy) as database, ThreadPoolExecutor(2) as threads:
        hung = threads.submit(database.execute, SLOW_BUILTINS["trim"], QueryLimits(timeout_s=SLOW_TIMEOUT_S))
        quick = [threads.submit(database.execute, "SELECT COUNT(*) FROM Track", QueryLimits()) for _ in range(20)]
        assert [future.result(timeout=SLOW_BOUND_S).rows for future in quick] == [[(3503,)]] * 20
        assert not hung.done(), "the quick queries were answered while the slow one ran"
        assert hung.result(timeout=SLOW_BOUND_S).timed_out


# --- worker processes: started lazily, replaced when killed, gone when the database closes ----------------
def worker_children(parent: int) -> list[int]:
    """Live (not zombie) query-worker processes whose parent is ``parent``, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == parent and state != "Z" and b"query_worker.py" in command:
            found.append(int(entry.name))
    return found


def all_exit(pids: list[int], seconds: float = 10.0) -> bool:
    """Whether every process in ``pids`` is gone (or a zombie) within ``seconds``."""
    end = time.monotonic() + seconds
    while not all(map(gone, pids)) and time.monotonic() < end:
        time.sleep(0.02)
    return all(map(gone, pids))


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_killed_worker_is_replaced_transparently(chinook_copy: Path) -> None:
    with ReadOnlyDatabase(chinook_copy) as database:
        assert database.execute("SELECT COUNT(*) FROM Genre", QueryLimits()).rows == [(25,)]
        workers = worker_children(os.getpid())
        assert workers, "the query ran in a worker process"
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        assert all_exit(workers)
        assert database.execute("SELECT COUNT(*) FROM Track", QueryLimits()).rows == [(3503,)]
        assert set(worker_children(os.getpid())).isdisjoint(workers)


CLOSE_SCRIPT = """
import gymnasium as gym, os, sys, time
import rl_llm
sys.path.insert(0, {tests!r})
from test_text_to_sql_security import worker_children
env = gym.make("rl-llm/TextToSQL-v0").unwrapped
env.reset(seed=0)
assert "25" in env.step("<sql>SELECT COUNT(*) FROM Genre</sql>")[0]
workers = worker_children(os.getpid())
assert workers, "the query ran in a worker process"
env.close()
assert worker_children(os.getpid()) == [], worker_children(os.getpid())
print("closed", *workers)
"""


def test_closing_the_env_leaves_no_worker_process() -> None:
    # A fresh process, so that databases other tests left open do not keep the shared workers alive.
    script = CLOSE_SCRIPT.format(tests=str(Path(__file__).parent))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("closed "), done.stderr
    assert all_exit([int(pid) for pid in done.stdout.split()[1:]])


HANG_SCRIPT = """
import sys
import rl_llm
from rl_llm.envs.sql.database import QueryLimits, ReadOnlyDatabase
database = ReadOnlyDatabase(sys.argv[1])
database.execute("SELECT 1", QueryLimits())  # starts the worker that then runs the slow query
print("started", flush=True)
database.execute(sys.argv[2], QueryLimits(timeout_s=600))
"""


def test_a_worker_stuck_in_a_query_exits_when_its_parent_is_killed(chinook_copy: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", HANG_SCRIPT, str(chinook_copy), SLOW_BUILTINS["trim"]],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert parent.stdout is not None and parent.stdout.readline() == "started\n"
        workers = worker_children(parent.pid)
        assert workers
        time.sleep(0.2)  # the slow query has reached the worker
    finally:
        parent.kill()
        parent.wait()
    assert all_exit(workers)

