"""Tic-tac-toe baselines that read the board from the observation text and answer ``<move>..</move>``."""

from __future__ import annotations

import re

import numpy as np

from rl_llm.agents.policy import TextPolicy, last_user_message
from rl_llm.envs.tictactoe.rules import CELL_NAMES, legal_moves, optimal_moves, winner
from rl_llm.types import Message

_BOARD_ROW = re.compile(r"^([ABC]) ([XO.]) ([XO.]) ([XO.])$", re.MULTILINE)


def parse_board(observation: str) -> str:
    """The 9-character board from an observation (the last board drawn in it)."""
    rows = {row: "".join(cells) for row, *cells in _BOARD_ROW.findall(observation)}
    if set(rows) != {"A", "B", "C"}:
        raise ValueError("not a tic-tac-toe observation: no complete board")
    return rows["A"] + rows["B"] + rows["C"]


class TicTacToePolicy(TextPolicy):
    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    def respond(self, conversation: list[Message]) -> str:
        board = parse_board(last_user_message(conversation))
        if winner(board) is not None:
            raise ValueError("the game on this board is already over")
        choices = self.candidates(board)
        return f"<move>{CELL_NAMES[choices[self.rng.integers(len(choices))]]}</move>"

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
