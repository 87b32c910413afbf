"""Tic-tac-toe rules, the text interface, illegal moves, and the minimax baseline."""

from __future__ import annotations

import gymnasium as gym
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rl_llm  # noqa: F401
from rl_llm.agents.baselines import make_baseline
from rl_llm.agents.baselines.tictactoe import parse_board
from rl_llm.agents.evaluate import evaluate
from rl_llm.envs.tictactoe.rules import CELL_NAMES, CELL_NUMBERS, optimal_moves, parse_cell, read_move, winner
from rl_llm.types import Message
from tests.conftest import hostile_text

TTT = "rl-llm/TicTacToe-v0"


@pytest.mark.parametrize("text", ["B2", "b2", " 2B ", "2,2", "(2, 2)", "5"])
def test_all_coordinate_styles_name_the_centre(text: str) -> None:
    assert parse_cell(text) == 4


@pytest.mark.parametrize("text", ["D1", "A4", "0", "10", "2,4", "", "centre", "B 2 3"])
def test_non_cells_are_rejected(text: str) -> None:
    assert parse_cell(text) is None


def test_read_move_takes_the_last_tag_and_says_why_a_move_cannot_be_played() -> None:
    board = "X" + "." * 8
    assert read_move("<move>A2</move> no: <move>B2</move>", board) == (4, None)
    assert read_move("B2", board)[1].startswith("No move found")
    assert "'Z9' is not a cell" in read_move("<move>Z9</move>", board)[1]
    assert read_move("<move>a1</move>", board) == (None, "A1 is already taken.")


def test_winner_detects_lines_draws_and_open_games() -> None:
    assert winner("XXX" "OO." "...") == "X"
    assert winner("O.X" "OX." "O..") == "O"
    assert winner("XOX" "XOO" "OXX") == "draw"
    assert winner("XO." "..." "...") is None


def test_solver_takes_an_immediate_win_and_blocks_a_threat() -> None:
    assert optimal_moves("XX." "OO." "...") == (2,)  # X to move wins at A3
    assert optimal_moves("XX." "O.." "...") == (2,)  # O to move must block A3


def test_agent_as_o_sees_the_opening_move_and_a_board_it_can_parse() -> None:
    env = gym.make(TTT, agent_mark="O")
    observation, info = env.reset(seed=3)
    board = parse_board(observation)
    assert board.count("X") == 1 and board.count("O") == 0
    assert "The opponent played" in observation and "You play O." in observation
    assert "as O" in info["system_prompt"]


def test_illegal_moves_keep_the_board_and_too_many_in_a_row_lose() -> None:
    env = gym.make(TTT, agent_mark="X", max_illegal_moves=2, illegal_move_penalty=0.25)
    env.reset(seed=0)
    observation, reward, terminated, _, info = env.step("<move>B2</move>")
    taken = CELL_NAMES[parse_board(observation).index("O")]
    observation, reward, terminated, _, info = env.step(f"<move>{taken}</move>")
    assert info["invalid_action"] and not terminated
    assert "already taken" in observation and reward == -0.25
    assert parse_board(observation).count(".") == 7
    observation, reward, terminated, _, info = env.step("no tags at all")
    assert "No move found" in observation and not terminated
    _, reward, terminated, _, info = env.step("<move>Z9</move>")
    assert terminated and reward == pytest.approx(-1.25)
    assert info["metrics"]["loss"] == 1.0 and info["metrics"]["illegal_moves"] == 3


def test_a_legal_move_resets_the_illegal_streak() -> None:
    env = gym.make(TTT, agent_mark="X", max_illegal_moves=1)
    env.reset(seed=0)
    env.step("bad")
    _, _, terminated, _, _ = env.step("<move>B2</move>")
    assert not terminated
    _, _, terminated, _, _ = env.step("bad again")
    assert not terminated


def test_outcome_reward_matches_the_result_of_each_game() -> None:
    records = evaluate(TTT, make_baseline("random", TTT, seed=0), 60, seed=0, env_kwargs={"agent_mark": "X"})
    for record in records:
        expected = record.metrics["win"] - record.metrics["loss"]
        assert record.terminated and record.total_reward == expected
        assert record.metrics["win"] + record.metrics["draw"] + record.metrics["loss"] == 1.0
    assert {r.total_reward for r in records} == {-1.0, 0.0, 1.0}


@pytest.mark.parametrize("opponent", ["random", "minimax"])
def test_minimax_never_loses_over_200_games(opponent: str) -> None:
    records = evaluate(TTT, make_baseline("minimax", TTT, seed=1), 200, seed=0, env_kwargs={"opponent": opponent})
    assert all(record.metrics["loss"] == 0.0 for record in records)
    assert not any(turn.invalid_action for record in records for turn in record.turns)
    if opponent == "minimax":
        assert all(record.metrics["draw"] == 1.0 for record in records)
    else:
        assert sum(record.metrics["win"] for record in records) > 150


def test_mixed_opponent_strength_lies_between_random_and_minimax() -> None:
    def random_agent_losses(**kwargs) -> float:
        records = evaluate(TTT, make_baseline("random", TTT, seed=2), 150, seed=0, env_kwargs=kwargs)
        return sum(record.metrics["loss"] for record in records)

    weak, mixed, perfect = (random_agent_losses(opponent="random"),
                            random_agent_losses(opponent="mixed", opponent_skill=0.5),
                            random_agent_losses(opponent="minimax"))
    assert weak < mixed < perfect


def test_a_failed_reset_leaves_no_episode_to_step() -> None:
    env = gym.make(TTT, agent_mark="X")
    env.reset(seed=0)
    env.step("<move>B2</move>")
    with pytest.raises(ValueError, match="agent_mark"):
        env.reset(seed=1, options={"agent_mark": "Z"})
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("<move>A1</move>")
    env.reset(seed=1)
    assert not env.step("<move>B2</move>")[4]["invalid_action"]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"agent_mark": "Y"}, "agent_mark"), ({"opponent": "perfect"}, "opponent"),
    ({"opponent_skill": 1.5}, "opponent_skill"), ({"max_illegal_moves": -1}, "max_illegal_moves"),
    ({"max_turns": 0}, "max_turns"), ({"cell_names": "roman"}, "cell_names"),
])
def test_bad_arguments_get_specific_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gym.make(TTT, **kwargs)


def test_numbered_cells_draw_empty_cells_by_number_and_speak_numbers_throughout() -> None:
    env = gym.make(TTT, agent_mark="O", cell_names="numbers")
    observation, info = env.reset(seed=3)
    board = parse_board(observation)
    opening = board.index("X")
    assert f"The opponent played {opening + 1}." in observation
    cells = [mark if mark != "." else str(i + 1) for i, mark in enumerate(board)]
    drawn = "\n".join(" ".join(cells[3 * r : 3 * r + 3]) for r in range(3))
    assert drawn in observation and "A " not in observation
    assert "Legal moves: " + ", ".join(str(i + 1) for i in range(9) if i != opening) in observation
    assert "<move>5</move>" in info["system_prompt"] and "numbered 1-9" in info["system_prompt"]
    observation, *_, step_info = env.step(f"<move>{opening + 1}</move>")
    assert step_info["invalid_action"] and f"{opening + 1} is already taken." in observation
    assert "'Z' is not a cell: use a cell number 1-9 such as 5." in env.step("<move>Z</move>")[0]


@pytest.mark.parametrize(("cell_names", "names"), [("letters", CELL_NAMES), ("numbers", CELL_NUMBERS)])
def test_baselines_read_either_board_and_answer_in_its_naming(cell_names: str, names: tuple[str, ...]) -> None:
    env = gym.make(TTT, agent_mark="X", cell_names=cell_names)
    observation, _ = env.reset(seed=0)
    minimax = make_baseline("minimax", TTT, seed=1)
    answer = minimax.act([[Message("user", observation)]])[0].text
    assert answer.removeprefix("<move>").removesuffix("</move>") in names
    observation = env.step(answer)[0]
    assert parse_board(observation).count("X") == 1 and parse_board(observation).count("O") == 1
    records = evaluate(TTT, minimax, 60, seed=0, env_kwargs={"opponent": "random", "cell_names": cell_names})
    assert all(not any(turn.invalid_action for turn in r.turns) and r.metrics["loss"] == 0.0 for r in records)


@given(actions=st.lists(hostile_text(), min_size=1, max_size=6), seed=st.integers(0, 2**16))
def test_numbered_variant_survives_arbitrary_text(actions: list[str], seed: int) -> None:
    env = gym.make(TTT, cell_names="numbers", max_illegal_moves=1)
    env.reset(seed=seed)
    for turn in range(env.unwrapped.max_turns):
        observation, _, terminated, truncated, info = env.step(actions[turn % len(actions)])
        assert isinstance(observation, str) and info.keys() >= {"invalid_action", "metrics"}
        if terminated or truncated:
            break
    else:
        pytest.fail("episode did not end within max_turns")
    assert env.reset(seed=seed)[0].startswith(("1 2 3", "The opponent played"))
