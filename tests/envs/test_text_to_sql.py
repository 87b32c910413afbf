"""TextToSQL-v0: tasks, the multi- and single-turn protocols, and execution-match grading on real SQLite."""

from __future__ import annotations

import itertools
import json
import math
import sqlite3
from pathlib import Path

import gymnasium as gym
import pytest
import sqlglot
from sqlglot import exp

import rl_llm  # noqa: F401
from rl_llm.agents.baselines import make_baseline
from rl_llm.agents.evaluate import evaluate
from rl_llm.envs.sql.results import has_top_level_order_by, results_match
from rl_llm.envs.sql.tasks import CHINOOK_DB, SqlTask
from rl_llm.envs.sql.text_to_sql import TextToSQLEnv

ENV_ID = "rl-llm/TextToSQL-v0"


def make(**kwargs) -> TextToSQLEnv:
    return gym.make(ENV_ID, query_timeout_s=1.0, **kwargs).unwrapped


def submit(env: TextToSQLEnv, sql: str, index: int | None = None, think: bool = True):
    env.reset(seed=0, options=None if index is None else {"task_index": index})
    prefix = "<think>plan</think>" if think else ""
    return env.step(f"{prefix}<solution>{sql}</solution>")


def chinook_index(env: TextToSQLEnv, number: str) -> int:
    return next(i for i, task in enumerate(env.tasks) if task.task_id == f"chinook-{number}")


def _order_keys_distinct(db_path: Path, sql: str) -> bool:
    """For a gold query with ORDER BY: no two rows up to the LIMIT cut share their sort key (ties would make
    the expected row order, or the rows kept by LIMIT, ambiguous)."""
    tree = sqlglot.parse_one(sql, read="sqlite")
    projections = {p.alias: p.this for p in tree.expressions if isinstance(p, exp.Alias)}
    keys = []
    for ordered in tree.args["order"].expressions:
        key = ordered.this
        if isinstance(key, exp.Literal) and key.is_int:  # ORDER BY 2
            key = tree.expressions[int(key.name) - 1].unalias()
        elif isinstance(key, exp.Column) and not key.table and key.name in projections:  # ORDER BY an alias
            key = projections[key.name]
        keys.append(key.copy())
    limit = tree.args.get("limit")
    cut = int(limit.expression.name) if limit is not None else None
    probe = tree.copy()
    probe.set("limit", None)
    width = len(probe.expressions)
    probe = probe.select(*keys, append=True)
    connection = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        rows = [row[width:] for row in connection.execute(probe.sql(dialect="sqlite")).fetchall()]
    finally:
        connection.close()
    checked = rows if cut is None else rows[: cut + 1]
    return all(a != b for a, b in itertools.pairwise(checked))


def _assert_gold_tasks_are_sound(tasks: list[SqlTask]) -> None:
    for task in tasks:
        connection = sqlite3.connect(f"file:{task.db_path}?mode=ro", uri=True)
        try:
            rows = connection.execute(task.gold_sql).fetchall()
            connection.execute("PRAGMA reverse_unordered_selects = ON")
            reversed_rows = connection.execute(task.gold_sql).fetchall()
        finally:
            connection.close()
        assert rows, f"{task.task_id}: gold result is empty"
        ordered = has_top_level_order_by(task.gold_sql)
        assert results_match(reversed_rows, rows, ordered=ordered), f"{task.task_id}: depends on scan order"
        if ordered:
            assert _order_keys_distinct(task.db_path, task.gold_sql), f"{task.task_id}: ties in ORDER BY"


# -- bundled data ----------------------------------------------------------------------------------------
def test_bundled_questions_are_graded_and_every_gold_query_is_sound() -> None:
    env = make()
    assert len(env.tasks) >= 40
    difficulties = {task.difficulty for task in env.tasks}
    assert difficulties == {"easy", "medium", "hard"}
    assert len({task.task_id for task in env.tasks}) == len(env.tasks)
    assert len({task.question for task in env.tasks}) == len(env.tasks)
    _assert_gold_tasks_are_sound(env.tasks)
    gold = " ".join(task.gold_sql.upper() for task in env.tasks)
    for feature in ("JOIN", "GROUP BY", "HAVING", "ORDER BY", "LIMIT", "NOT IN", "DISTINCT", "(SELECT"):
        assert feature in gold, f"no bundled question uses {feature}"


def test_oracle_scores_one_on_every_bundled_task() -> None:
    env = make()
    for index in range(len(env.tasks)):
        _, reward, terminated, truncated, info = submit(env, env.tasks[index].gold_sql, index)
        assert (reward, terminated, truncated) == (1.0, True, False), env.tasks[index].task_id
        assert info["metrics"]["exec_match"] == 1.0


def test_oracle_agents_through_the_rollout_loop() -> None:
    for name, turns in (("oracle", 1.0), ("schema-probe", 2.0)):
        policy = make_baseline(name, ENV_ID, seed=0)
        trajectories = evaluate(ENV_ID, policy, 12, seed=5)
        assert all(t.total_reward == 1.0 for t in trajectories), name
        assert all(len(t.turns) == turns for t in trajectories), name


# Semantically equal rewrites: other join orders, aliases, subqueries instead of joins, column orders.
REWRITES = {
    "003": "SELECT mt.Name FROM MediaType AS mt ORDER BY mt.Name DESC",
    "010": "SELECT ROUND(SUM(inv.Total), 2) FROM Invoice inv WHERE inv.InvoiceDate >= '2009-01-01' "
           "AND inv.InvoiceDate < '2010-01-01'",
    "018": "SELECT COUNT(Album.AlbumId) FROM Artist JOIN Album ON Artist.ArtistId = Album.ArtistId "
           "WHERE Artist.Name = 'Iron Maiden'",
    "020": "SELECT COUNT(*) AS n, Genre.Name FROM Genre INNER JOIN Track USING (GenreId) GROUP BY Genre.Name",
    "024": "SELECT x.FirstName, x.LastName, (SELECT COUNT(*) FROM Customer c WHERE c.SupportRepId = x.EmployeeId) "
           "FROM Employee x WHERE x.EmployeeId IN (SELECT SupportRepId FROM Customer)",
    "025": "SELECT inv.BillingCountry, TOTAL(inv.Total) AS t FROM Invoice inv GROUP BY 1 ORDER BY t DESC LIMIT 5",
    "036": "SELECT COUNT(DISTINCT inv.CustomerId) FROM Genre gen JOIN Track tr ON tr.GenreId = gen.GenreId "
           "JOIN InvoiceLine line ON line.TrackId = tr.TrackId JOIN Invoice inv ON inv.InvoiceId = line.InvoiceId "
           "WHERE gen.Name = 'Jazz'",
    "037": "SELECT a.Name FROM Artist a LEFT JOIN Album b ON a.ArtistId = b.ArtistId WHERE b.AlbumId IS NULL",
    "038": "SELECT COUNT(*) FROM Track t WHERE NOT EXISTS (SELECT 1 FROM InvoiceLine il WHERE il.TrackId = t.TrackId)",
    "051": "WITH s AS (SELECT CustomerId, SUM(Total) AS t FROM Invoice GROUP BY CustomerId) "
           "SELECT c.Country, COUNT(*), SUM(s.t) FROM s JOIN Customer c ON c.CustomerId = s.CustomerId "
           "GROUP BY c.Country ORDER BY 3 DESC, 1",
}  # fmt: skip
# Wrong answers: another filter value, one row too many, lost DISTINCT (duplicates), reversed order.
WRONG = {
    "002": "SELECT COUNT(*) FROM Customer WHERE Country = 'Canada'",
    "025": "SELECT BillingCountry, SUM(Total) FROM Invoice GROUP BY BillingCountry ORDER BY SUM(Total) DESC LIMIT 6",
    "047": "SELECT c.FirstName, c.LastName FROM Customer AS c JOIN Invoice AS i ON i.CustomerId = c.CustomerId "
           "JOIN InvoiceLine AS il ON il.InvoiceId = i.InvoiceId JOIN Track AS t ON il.TrackId = t.TrackId "
           "JOIN Album AS al ON t.AlbumId = al.AlbumId JOIN Artist AS ar ON al.ArtistId = ar.ArtistId "
           "WHERE ar.Name = 'AC/DC'",
    "006": "SELECT Name FROM Track ORDER BY Milliseconds DESC LIMIT 5",
    "041": "SELECT e.FirstName, e.LastName, SUM(i.Total) FROM Employee AS e JOIN Customer AS c ON "
           "c.SupportRepId = e.EmployeeId JOIN Invoice AS i ON i.CustomerId = c.CustomerId GROUP BY e.EmployeeId "
           "ORDER BY SUM(i.Total) ASC",
    "009": "SELECT AVG(Total) FROM Invoice WHERE Total > 1",
}  # fmt: skip


@pytest.mark.parametrize("number", sorted(REWRITES))
def test_semantically_equal_rewrite_scores_one(number: str) -> None:
    env = make()
    index = chinook_index(env, number)
    assert REWRITES[number] != env.tasks[index].gold_sql
    _, reward, *_ = submit(env, REWRITES[number], index)
    assert reward == 1.0


@pytest.mark.parametrize("number", sorted(WRONG))
def test_wrong_query_scores_zero(number: str) -> None:
    env = make()
    _, reward, terminated, _, info = submit(env, WRONG[number], chinook_index(env, number))
    assert terminated and reward == 0.0
    assert info["metrics"]["exec_match"] == 0.0


def test_failing_or_oversized_solutions_score_zero_with_a_reason() -> None:
    env = make(max_result_rows=100)
    env.reset(options={"task_index": 0})
    env.step("<solution>SELECT nope FROM Track</solution>")
    assert "no such column" in env.transcript
    env.reset(options={"task_index": 0})
    _, reward, *_ = env.step("<solution>SELECT * FROM Track</solution>")
    assert reward == 0.0 and "more rows than the result limit" in env.transcript


# -- protocol --------------------------------------------------------------------------------------------
def test_multi_turn_exploration_shows_results_and_turns_left() -> None:
    env = make(display_rows=2)
    observation, info = env.reset(seed=1)
    assert "CREATE TABLE Track" in observation and "example rows of Track" in observation
    assert info["stop"] == ["</sql>", "</solution>"] and "<solution>" in info["system_prompt"]
    observation, reward, terminated, truncated, info = env.step(
        "<think>look</think><sql>SELECT GenreId, Name FROM Genre ORDER BY GenreId</sql>"
    )
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert observation.startswith("<observation>") and observation.endswith("</observation>")
    assert "Showing the first 2 of 25 rows" in observation and "1 | Rock" in observation
    assert "3 | Metal" not in observation
    assert "You have 4 turns left" in observation  # SkyRL-SQL's 5 turns by default
    assert info["metrics"]["sql_queries"] == 1.0 and not info["invalid_action"]


def test_invalid_turns_get_a_corrective_observation_and_truncate_at_max_turns() -> None:
    env = make(max_turns=3, reward_weights="skyrl")
    env.reset(seed=2)
    observation, reward, terminated, truncated, info = env.step("SELECT 1")
    assert info["invalid_action"] and "previous action is invalid" in observation
    assert not (terminated or truncated) and reward == 0.0
    env.step("<sql>SELECT 1</sql>")
    observation, reward, terminated, truncated, info = env.step("<sql>SELECT 2</sql>")
    assert truncated and not terminated and observation == ""
    assert info["reward_components"] == {"execution": 0.0, "format_penalty": -1.0}
    assert reward == -1.0 and info["metrics"]["answered"] == 0.0


def test_single_turn_mode_answers_in_one_turn() -> None:
    env = make(mode="single")
    _observation, info = env.reset(seed=3)
    assert env.max_turns == 1 and "<sql>" not in info["system_prompt"]
    _, reward, terminated, truncated, info = env.step("<sql>SELECT 1</sql>")
    assert truncated and not terminated and reward == 0.0
    assert info["invalid_action"] and info["metrics"]["sql_queries"] == 0.0, "no exploration in single mode"
    gold = env.current_task.gold_sql
    _, reward, terminated, _, _ = submit(env, gold, env.task_index)
    assert terminated and reward == 1.0


def test_reward_components_are_weighted_terms_that_sum_to_the_reward() -> None:
    env = make(reward_weights="reasoning_sql")
    index = chinook_index(env, "018")
    _, reward, _, _, info = submit(env, env.tasks[index].gold_sql, index)
    assert info["reward_components"] == {"execution": 3.0, "syntax": 1.0, "schema_linking": 1.0, "ngram": 1.0,
                                         "format": 0.5}  # fmt: skip
    assert reward == 6.5
    _, reward, _, _, info = submit(env, WRONG["002"], chinook_index(env, "002"), think=False)
    components = info["reward_components"]
    assert components["execution"] == 0.0 and components["syntax"] == 1.0 and components["format"] == 0.0
    assert 0.0 < components["ngram"] < 1.0 and components["schema_linking"] == 1.0
    assert math.isclose(reward, sum(components.values()))


def test_format_requires_thinking_in_every_turn_and_one_solution() -> None:
    env = make(reward_weights="think2sql")
    gold = env.tasks[0].gold_sql
    env.reset(options={"task_index": 0})
    env.step("<sql>SELECT 1</sql>")  # no <think> in this turn
    _, reward, *_ = env.step(f"<think>ok</think><solution>{gold}</solution>")
    assert reward == pytest.approx(0.85)
    env.reset(options={"task_index": 0})
    _, reward, *_ = env.step(f"<think>ok</think><solution>{gold}</solution><solution>x</solution>")
    assert reward == pytest.approx(0.85)
    _, reward, *_ = submit(env, gold, 0)
    assert reward == pytest.approx(1.0)


def test_task_selection_by_seed_and_index() -> None:
    env = make()
    assert env.reset(seed=4)[1]["task_id"] == env.reset(seed=4)[1]["task_id"]
    seen = {env.reset(seed=seed)[1]["task_index"] for seed in range(40)}
    assert len(seen) > 10
    _, info = env.reset(options={"task_index": 7})
    assert info["task_index"] == 7 and info["task_id"].endswith(env.tasks[7].task_id)
    with pytest.raises(ValueError, match="task_index"):
        env.reset(options={"task_index": len(env.tasks)})


def test_schema_sample_rows_argument() -> None:
    assert "example rows" not in make(sample_rows=0).reset(seed=0)[0]
    observation = make(sample_rows=1).reset(seed=0)[0]
    assert "1 example rows of Artist:\nArtistId | Name\n1 | AC/DC\n*/" in observation


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="mode"):
        TextToSQLEnv(mode="chat")
    with pytest.raises(ValueError, match="dataset"):
        TextToSQLEnv(dataset="spider")
    with pytest.raises(ValueError, match="reward"):
        TextToSQLEnv(reward_weights={"bleu": 1.0})


# -- generated data --------------------------------------------------------------------------------------
def test_generated_tasks_are_sound_and_the_oracle_solves_them(tmp_path: Path) -> None:
    env = make(dataset="generated", generated_databases=12, generated_dir=tmp_path)
    assert len(env.tasks) >= 90
    assert len({task.question for task in env.tasks}) == len(env.tasks), "a question is asked once"
    assert len({task.db_id.split("_")[0] for task in env.tasks}) == 4
    _assert_gold_tasks_are_sound(env.tasks)
    for index, task in enumerate(env.tasks):
        _, reward, *_ = submit(env, task.gold_sql, index)
        assert reward == 1.0, task.task_id
    features = " ".join(task.gold_sql for task in env.tasks)
    for feature in ("JOIN", "GROUP BY", "HAVING", "ORDER BY", "NOT IN", "(SELECT", "AVG(", "SUM("):
        assert feature in features


def test_generation_is_deterministic_per_seed(tmp_path: Path) -> None:
    first = make(dataset="generated", generated_databases=4, generated_dir=tmp_path / "a").tasks
    again = make(dataset="generated", generated_databases=4, generated_dir=tmp_path / "b").tasks
    other = make(dataset="generated", generated_databases=4, generator_seed=1, generated_dir=tmp_path / "c").tasks
    assert [(t.question, t.gold_sql) for t in first] == [(t.question, t.gold_sql) for t in again]
    assert [t.db_path.read_bytes() for t in first[:1]] == [t.db_path.read_bytes() for t in again[:1]]
    assert [t.question for t in first] != [t.question for t in other]


def test_generated_databases_go_to_the_package_cache_by_default(tmp_path: Path, monkeypatch) -> None:
    # Not a world-shared temp folder, where another user's files would be unreadable (or not theirs to trust).
    monkeypatch.setenv("RL_LLM_CACHE", str(tmp_path))
    tasks = make(dataset="generated", generated_databases=1).tasks
    assert tasks and all(task.db_path.parent == tmp_path / "sql-generated" for task in tasks)


# -- Spider / BIRD directories ---------------------------------------------------------------------------
def _write_spider_dir(root: Path, layout: str) -> None:
    db_dir = root / ("database" if layout == "spider" else "dev_databases") / "shop"
    db_dir.mkdir(parents=True)
    connection = sqlite3.connect(db_dir / "shop.sqlite")
    connection.executescript(
        "CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT, price REAL);"
        "INSERT INTO item VALUES (1, 'pen', 1.5), (2, 'book', 12.0), (3, 'lamp', 30.25);"
    )
    connection.commit()
    connection.close()
    key = "query" if layout == "spider" else "SQL"
    questions = [
        {"db_id": "shop", "question": "How many items are there?", key: "SELECT count(*) FROM item"},
        {"db_id": "shop", "question": "Which items are expensive?", key: "SELECT name FROM item WHERE price > 10",
         "evidence": "expensive means a price above 10"},
    ]  # fmt: skip
    (root / "dev.json").write_text(json.dumps(questions))
    (root / "tables.json").write_text("[]")


@pytest.mark.parametrize("layout", ["spider", "bird"])
def test_spider_and_bird_directories_load(tmp_path: Path, layout: str) -> None:
    _write_spider_dir(tmp_path, layout)
    env = make(data_dir=tmp_path, split="dev")
    assert len(env.tasks) == 2
    observation, info = env.reset(options={"task_index": 1})
    assert "CREATE TABLE item" in observation and "Which items are expensive?" in observation
    assert "External knowledge: expensive means a price above 10" in observation
    assert info["db_id"] == "shop"
    _, reward, *_ = env.step("<solution>SELECT name FROM item WHERE price >= 12 ORDER BY name</solution>")
    assert reward == 1.0


def test_spider_directory_errors_are_specific(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a directory"):
        make(data_dir=tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no question file"):
        make(data_dir=tmp_path, split="dev")
    (tmp_path / "dev.json").write_text(json.dumps([{"db_id": "gone", "question": "q", "query": "SELECT 1"}]))
    with pytest.raises(FileNotFoundError, match="databases of split 'dev' are missing"):
        make(data_dir=tmp_path, split="dev")
    with pytest.raises(ValueError, match="unknown split"):
        make(data_dir=tmp_path, split="validation")


def test_chinook_database_ships_with_license_note() -> None:
    assert CHINOOK_DB.is_file()
    note = (CHINOOK_DB.parent / "CHINOOK_LICENSE.md").read_text(encoding="utf-8")
    assert "MIT" in note and "Luis Rocha" in note
