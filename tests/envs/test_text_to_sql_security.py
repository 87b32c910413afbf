"""Hostile SQL against TextToSQL: refused or stopped by the timeout, with a clear observation, and the
database file byte-identical afterwards."""

from __future__ import annotations

import hashlib
import shutil
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
        ("ALTER TABLE Genre ADD COLUMN y", "alter table"),
        (f"ATTACH DATABASE '{outside / 'attached.db'}' AS evil", "attach"),
        (f"VACUUM INTO '{outside / 'copy.db'}'", "attach"),
        ("PRAGMA writable_schema = ON", "pragma writable_schema is not allowed"),
        ("PRAGMA journal_mode = WAL", "pragma journal_mode is not allowed"),
        ("PRAGMA query_only = OFF", "pragma query_only is not allowed"),
        ("SELECT load_extension('/tmp/libevil.so')", "function load_extension is not allowed"),
        ("BEGIN IMMEDIATE", "transaction"),
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
