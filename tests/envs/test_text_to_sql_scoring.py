"""Execution-match comparison, partial rewards and the Chinook fixture converter of TextToSQL."""

from __future__ import annotations

import os
import shutil
import sqlite3

import pytest

from rl_llm.envs.sql.chinook import build_chinook
from rl_llm.envs.sql.database import QueryLimits
from rl_llm.envs.sql.results import has_top_level_order_by, results_match
from rl_llm.envs.sql.rewards import (
    REWARD_PRESETS,
    ngram_score,
    parse_query,
    resolve_weights,
    schema_items,
    schema_linking_score,
    syntax_score,
    thinks_before_action,
)
from rl_llm.envs.sql.scoring import GoldCache, SqlScorer
from rl_llm.envs.sql.tasks import CHINOOK_DB, SqlTask


def test_rows_compare_as_multisets_unless_ordered() -> None:
    gold = [(1, "a"), (2, "b"), (2, "b")]
    assert results_match([(2, "b"), (1, "a"), (2, "b")], gold)
    assert not results_match([(2, "b"), (1, "a"), (1, "a")], gold), "duplicates must count"
    assert not results_match([(1, "a"), (2, "b")], gold)
    assert not results_match([(2, "b"), (1, "a"), (2, "b")], gold, ordered=True)
    assert results_match(list(gold), gold, ordered=True)


def test_numbers_compare_by_value_with_tolerance() -> None:
    assert results_match([(1.0,)], [(1,)])
    assert results_match([(483.44,)], [(483.44000000000034,)])
    assert not results_match([(483.44,)], [(483.44000000000034,)], tolerance=0.0)
    assert not results_match([(483.45,)], [(483.44,)])
    assert not results_match([("1",)], [(1,)]), "text is not a number"
    assert results_match([(None, 2)], [(None, 2)])


def test_column_order_does_not_matter_but_contents_do() -> None:
    gold = [("Rock", 3), ("Jazz", 1)]
    assert results_match([(1, "Jazz"), (3, "Rock")], gold)
    assert not results_match([(3, "Jazz"), (1, "Rock")], gold)
    assert not results_match([("Rock",), ("Jazz",)], gold)
    # Two columns with identical contents: either order is the same answer.
    assert results_match([(1, 1), (2, 2)], [(1, 1), (2, 2)])


def test_empty_results() -> None:
    assert results_match([], [])
    assert not results_match([(1,)], [])
    assert not results_match([], [(1,)])


def test_order_by_detection_is_top_level_only() -> None:
    assert has_top_level_order_by("SELECT a FROM t ORDER BY a")
    assert has_top_level_order_by("SELECT a FROM t UNION SELECT b FROM u ORDER BY 1")
    assert not has_top_level_order_by("SELECT a FROM (SELECT a FROM t ORDER BY a LIMIT 3)")
    assert not has_top_level_order_by("SELECT COUNT(*) FROM t WHERE x IN (SELECT x FROM u ORDER BY x)")


def test_syntax_score_accepts_queries_only() -> None:
    assert syntax_score("SELECT a FROM t WHERE b > 1") == 1.0
    assert syntax_score("WITH c AS (SELECT 1 AS x) SELECT x FROM c") == 1.0
    assert syntax_score("SELECT FROM WHERE") == 0.0
    assert syntax_score("DROP TABLE t") == 0.0
    assert syntax_score("SELECT 1; SELECT 2") == 0.0
    assert syntax_score("hello world") == 0.0
    assert syntax_score("(" * 5000 + "1" + ")" * 5000) == 0.0
    assert syntax_score("") == 0.0


def test_schema_items_resolve_aliases_and_unqualified_columns() -> None:
    schema = {"Album": ["AlbumId", "Title", "ArtistId"], "Artist": ["ArtistId", "Name"]}
    tree = parse_query("SELECT Title, ar.Name FROM Album AS al JOIN Artist ar ON al.ArtistId = ar.ArtistId")
    assert tree is not None
    assert schema_items(tree, schema) == {
        "album", "artist", "album.title", "artist.name", "album.artistid", "artist.artistid",
    }  # fmt: skip
    cte = parse_query("WITH c AS (SELECT ArtistId AS k FROM Album) SELECT c.k FROM c")
    assert cte is not None
    assert schema_items(cte, schema) == {"album", "album.artistid"}


def test_schema_linking_and_ngram_scores() -> None:
    gold = "SELECT Name FROM Artist WHERE ArtistId = 1"
    assert schema_linking_score(gold, gold) == 1.0
    assert schema_linking_score("SELECT a.Name FROM Artist AS a WHERE a.ArtistId = 1", gold) == 1.0
    partial = schema_linking_score("SELECT Title FROM Album", gold)
    assert partial == 0.0
    half = schema_linking_score("SELECT Name FROM Artist", gold)
    assert 0.0 < half < 1.0
    assert schema_linking_score("not sql at all", gold) == 0.0
    assert ngram_score(gold, gold) == 1.0
    assert 0.0 < ngram_score("SELECT Name FROM Artist", gold) < 1.0
    assert ngram_score("", gold) == 0.0


def test_think_before_action_format() -> None:
    assert thinks_before_action("<think>plan</think>\n<solution>SELECT 1</solution>", "solution")
    assert not thinks_before_action("<solution>SELECT 1</solution><think>late</think>", "solution")
    assert not thinks_before_action("<think>never closed <solution>SELECT 1</solution>", "solution")
    assert not thinks_before_action("</think><think><solution>x</solution>", "solution")


def test_reward_weights_resolve_presets_and_reject_unknown_terms() -> None:
    assert resolve_weights(None) == {"execution": 1.0}
    assert resolve_weights("think2sql") == REWARD_PRESETS["think2sql"]
    assert resolve_weights({"execution": 2, "ngram": 0}) == {"execution": 2.0}
    with pytest.raises(ValueError, match="unknown reward preset"):
        resolve_weights("nope")
    with pytest.raises(ValueError, match="unknown reward terms"):
        resolve_weights({"llm_judge": 1.0})


def _fixture() -> list[dict]:
    def record(model: str, pk: int, **fields: object) -> dict:
        return {"model": f"chinook.{model}", "pk": pk, "fields": fields}

    return [
        record("artist", 1, name="AC/DC"),
        record("album", 1, title="Back in Black", artist=1),
        record("employee", 1, lastname="Adams", firstname="Andrew", title="GM", reports_to=None,
               birthdate="1962-02-18T00:00:00Z", hiredate="2002-08-14T00:00:00Z", city="Edmonton"),
        record("customer", 1, firstname="Luís", lastname="Gonçalves", email="l@x", support_rep=1, country="Brazil"),
        record("genre", 1, name="Rock"),
        record("mediatype", 1, name="MPEG audio file"),
        record("playlist", 1, name="Music"),
        record("track", 1, name="Hells Bells", album=1, mediatype=1, genre=1, composer=None,
               milliseconds=312000, bytes=100, unit_price=0.99),
        record("invoice", 1, customer=1, invoicedate="2009-01-01T00:00:00Z", billingcountry="Brazil", total=0.99),
        record("invoiceline", 1, invoice=1, track=1, unit_price=0.99, quantity=1),
        record("playlisttrack", 7, playlist=1, track=1),
    ]  # fmt: skip


def test_chinook_converter_builds_canonical_schema(tmp_path) -> None:
    out = tmp_path / "chinook.sqlite"
    counts = build_chinook(_fixture(), out)
    assert counts["Track"] == 1 and counts["PlaylistTrack"] == 1
    connection = sqlite3.connect(out)
    try:
        row = connection.execute(
            "SELECT e.HireDate, c.FirstName, t.UnitPrice FROM Employee e JOIN Customer c ON c.SupportRepId = "
            "e.EmployeeId JOIN Invoice i ON i.CustomerId = c.CustomerId JOIN InvoiceLine il ON "
            "il.InvoiceId = i.InvoiceId JOIN Track t ON t.TrackId = il.TrackId"
        ).fetchone()
    finally:
        connection.close()
    assert row == ("2002-08-14 00:00:00", "Luís", 0.99)


def test_chinook_converter_rejects_broken_fixtures(tmp_path) -> None:
    broken = [*_fixture(), {"model": "chinook.album", "pk": 2, "fields": {"title": "x", "artist": 99}}]
    with pytest.raises(ValueError, match="foreign keys"):
        build_chinook(broken, tmp_path / "a.sqlite")
    with pytest.raises(ValueError, match="does not know"):
        build_chinook([*_fixture(), {"model": "auth.user", "pk": 1, "fields": {}}], tmp_path / "b.sqlite")


def test_gold_results_are_cached_per_task_and_refreshed_when_the_file_changes(tmp_path) -> None:
    path = tmp_path / "chinook.sqlite"
    shutil.copyfile(CHINOOK_DB, path)
    task = SqlTask("t", "chinook", path, "How many genres?", "SELECT COUNT(*) FROM Genre")
    cache = GoldCache()
    scorer = SqlScorer(limits=QueryLimits(timeout_s=1), gold_limits=QueryLimits(timeout_s=1), cache=cache)
    uncached = SqlScorer(limits=QueryLimits(timeout_s=1), gold_limits=QueryLimits(timeout_s=1),
                         cache=cache, cache_gold=False)  # fmt: skip
    assert scorer.execution(task, "SELECT 25").values["execution"] == 1.0
    first = scorer.gold(task)
    assert scorer.gold(task) is first, "the second lookup must come from the cache"
    assert uncached.gold(task) is not first
    scorer.close()
    writer = sqlite3.connect(path)
    writer.execute("DELETE FROM Genre WHERE GenreId > 20")
    writer.commit()
    writer.close()
    os.utime(path, ns=(1, 1))  # a new modification time even on coarse-clock file systems
    fresh = SqlScorer(limits=QueryLimits(timeout_s=1), gold_limits=QueryLimits(timeout_s=1), cache=cache)
    assert fresh.execution(task, "SELECT 20").values["execution"] == 1.0
    assert fresh.execution(task, "SELECT 25").values["execution"] == 0.0
    fresh.close()
    uncached.close()
