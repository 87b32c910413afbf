"""TextToSQL-v0 reward hacks (issue 16): partial credit for queries that do not run, the SkyRL-SQL preset,
set matching, the turns-left message and duplicate generated questions."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest

import rl_llm  # noqa: F401
from rl_llm.envs.sql.results import sets_match
from rl_llm.envs.sql.rewards import parse_query, schema_items, skyrl_format
from rl_llm.envs.sql.text_to_sql import TextToSQLEnv

ENV_ID = "rl-llm/TextToSQL-v0"
BROKEN = "SELECT COUNT(nope) FROM Track WHERE zzz=1"  # parses, does not run (no such columns)
STAR = "SELECT * FROM Track"


def make(**kwargs) -> TextToSQLEnv:
    return gym.make(ENV_ID, query_timeout_s=1.0, **kwargs).unwrapped


def answer(env: TextToSQLEnv, index: int, sql: str, think: bool = True) -> tuple[float, dict]:
    env.reset(options={"task_index": index})
    _, reward, _, _, info = env.step(f"{'<think>plan</think>' if think else ''}<solution>{sql}</solution>")
    return reward, info


def test_a_query_that_does_not_run_never_beats_select_1_and_the_oracle_keeps_the_top() -> None:
    env = make(reward_weights="reasoning_sql")
    for index, task in enumerate(env.tasks):
        broken, info = answer(env, index, BROKEN)
        assert info["reward_components"]["syntax"] == 0.0, "the syntax term requires the query to execute"
        assert broken <= answer(env, index, "SELECT 1")[0], task.task_id
        assert answer(env, index, task.gold_sql)[0] == 6.5, task.task_id


def test_schema_linking_counts_unknown_columns_and_star() -> None:
    schema = {"Track": ["TrackId", "Name", "AlbumId"], "Album": ["AlbumId", "Title"]}
    assert schema_items(parse_query(BROKEN), schema) == {"track", "?.nope", "?.zzz"}
    assert schema_items(parse_query(STAR), schema) == {
        "track",
        "track.trackid",
        "track.name",
        "track.albumid",
    }
    assert schema_items(parse_query("SELECT COUNT(*) FROM Track"), schema) == {"track"}
    assert schema_items(parse_query("SELECT Name AS n FROM Track ORDER BY n"), schema) == {
        "track",
        "track.name",
    }
    env = make(reward_weights="reasoning_sql")
    count_tracks = next(
        i for i, t in enumerate(env.tasks) if t.gold_sql.strip().upper() == "SELECT COUNT(*) FROM TRACK"
    )
    _, info = answer(env, count_tracks, STAR)
    # Before: SELECT * linked only the table, the same items as COUNT(*): full schema-linking credit.
    assert info["reward_components"]["schema_linking"] < 0.2


def test_skyrl_preset_is_skyrl_sql_exactly() -> None:
    env = make(reward_weights="skyrl")
    assert env.max_turns == 5 and env.result_match == "set" and env.format_gate
    gold = env.tasks[0].gold_sql
    reward, info = answer(env, 0, gold, think=False)
    assert reward == -1.0, "SkyRL-SQL returns -1 for a broken format, even with the right result"
    assert info["metrics"]["exec_match"] == 1.0
    assert answer(env, 0, gold)[0] == 1.0
    assert answer(env, 0, "SELECT 1")[0] == 0.0
    assert make(reward_weights="skyrl", max_turns=6).max_turns == 6


def test_skyrl_format_is_skyrl_sqls_check_of_the_whole_chat() -> None:
    assert skyrl_format("<think>a</think><sql>SELECT 1</sql><observation>1</observation>\n<think>b</think><solution>x</solution>")
    assert skyrl_format("<sql>SELECT 1</sql><observation>1</observation> <think>b</think><solution>x</solution>")
    assert not skyrl_format("<think>a</think><sql>SELECT 1</sql><observation>1</observation>ok<solution>x</solution>")
    assert not skyrl_format("<think>a</think><solution><sql>x</sql></solution>")
    assert not skyrl_format("<think>a</think><solution>x</solution><solution>y</solution>")
    env = make(reward_weights="skyrl")
    gold = env.tasks[0].gold_sql
    env.reset(options={"task_index": 0})
    env.step("<think>look</think><sql>SELECT 1</sql>")
    _, reward, *_ = env.step(f"Now: <think>ok</think><solution>{gold}</solution>")
    assert reward == -1.0, "after an observation the turn must start with <think>"
    env.reset(options={"task_index": 0})
    env.step("<sql>SELECT 1</sql>")  # SkyRL needs one think somewhere, not one per turn
    _, reward, *_ = env.step(f"<think>ok</think><solution>{gold}</solution>")
    assert reward == 1.0


def test_set_matching_ignores_order_and_duplicates() -> None:
    assert sets_match([(1, "a"), (2, "b"), (2, "b")], [(2, "b"), (1, "a")])
    assert sets_match([(1,)], [(1.0,)])
    assert not sets_match([("a", 1)], [(1, "a")]), "SkyRL compares row tuples: column order counts"
    env = make(reward_weights="skyrl")
    index = next(
        i
        for i, t in enumerate(env.tasks)
        if "ORDER BY" not in t.gold_sql.upper() and "LIMIT" not in t.gold_sql.upper()
    )
    doubled = (
        f"SELECT * FROM ({env.tasks[index].gold_sql}) UNION ALL SELECT * FROM ({env.tasks[index].gold_sql})"
    )
    assert answer(env, index, doubled)[0] == 1.0
    assert answer(make(), index, doubled)[0] == 0.0, "the default multiset rule counts duplicates"
    with pytest.raises(ValueError, match="result_match"):
        make(result_match="bag")


def test_invalid_turn_says_how_many_turns_are_left() -> None:
    env = make()
    env.reset(seed=0)
    observation, *_ = env.step("no tags here")
    assert "You have 4 turns left" in observation
    assert observation.startswith("<observation>") and observation.endswith("</reminder></observation>")


def test_generated_questions_are_not_repeated(tmp_path: Path) -> None:
    tasks = make(dataset="generated", generated_databases=12, generated_dir=tmp_path).tasks
    questions = [task.question for task in tasks]
    assert len(set(questions)) == len(questions) == 93
