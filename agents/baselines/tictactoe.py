"""Tic-tac-toe baselines that read the board from the observation text and answer ``<move>..</move>``."""

from __future__ import annotations

import re

import numpy as np

from rl_llm.agents.policy import TextPolicy, last_user_message
from rl_llm.envs.tictactoe.rules import CELL_NAMES, CELL_NUMBERS, legal_moves, optimal_moves, winner
from rl_llm.types import Message

_BOARD_ROW = re.compile(r"^([ABC]) ([XO.]) ([XO.]) ([XO.])$", re.MULTILINE)
# cell_names="numbers": three lines of marks or the empty cells' own numbers, e.g. "X 2 3 / 4 O 6 / 7 8 9"
_NUMBERED_BOARD = re.compile(r"^([X1O]) ([X2O]) ([X3O])\n([X4O]) ([X5O]) ([X6O])\n([X7O]) ([X8O]) ([X9O])$", re.MULTILINE)


def parse_board(observation: str) -> str:
    """The 9-character board from an observation (the last board drawn in it, in either naming)."""
    return read_board(observation)[0]


def read_board(observation: str) -> tuple[str, tuple[str, ...]]:
    """The last board drawn in an observation and the cell names it uses (``CELL_NAMES`` or ``CELL_NUMBERS``)."""
    rows = {row: "".join(cells) for row, *cells in _BOARD_ROW.findall(observation)}
    if set(rows) == {"A", "B", "C"}:
        return rows["A"] + rows["B"] + rows["C"], CELL_NAMES
    numbered = _NUMBERED_BOARD.findall(observation)
    if numbered:
        return "".join(mark if mark in "XO" else "." for mark in numbered[-1]), CELL_NUMBERS
    raise ValueError("not a tic-tac-toe observation: no complete board")


class TicTacToePolicy(TextPolicy):
    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    def respond(self, conversation: list[Message]) -> str:
        board, names = read_board(last_user_message(conversation))
        if winner(board) is not None:
            raise ValueError("the game on this board is already over")
        choices = self.candidates(board)
        return f"<move>{names[choices[self.rng.integers(len(choices))]]}</move>"

    def candidates(self, board: str) -> tuple[int, ...]:
        """The moves to choose from (uniformly) on ``board``."""
        raise NotImplementedError


class RandomMove(TicTacToePolicy):
    name = "random"

    def candidates(self, board: str) -> tuple[int, ...]:
        return legal_moves(board)


class Minimax(TicTacToePolicy):
    """Perfect play: a uniformly random move among the minimax-optimal ones."""

    name = "minimax"

    def candidates(self, board: str) -> tuple[int, ...]:
        return optimal_moves(board)
