"""Tic-tac-toe rules and a perfect solver, shared by the single-agent env, the two-player PettingZoo game
and the minimax baseline.

The game has only 5,478 reachable boards, so the pure functions of a board are memoised: after warm-up an
env step is a few dictionary look-ups.

A board is a 9-character string, row-major, of ``"X"``, ``"O"`` and ``"."``; X always moves first.
Cells are named ``A1``..``C3`` (row letter, column digit) or numbered 1..9.
"""

from __future__ import annotations

import re
from functools import cache

from rl_llm.envs.parsing import extract_tag

EMPTY_BOARD = "." * 9
# The rules as both tic-tac-toe environments state them to the players.
HOW_TO_PLAY = (
    "X moves first. Get three of your marks in a row, column or diagonal to win. Cells are named by row letter "
    "(A-C, top to bottom) and column number (1-3, left to right)."
)
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
ROWS = "ABC"
CELL_NAMES = tuple(f"{row}{col}" for row in ROWS for col in "123")
# The other naming an env can use (``cell_names="numbers"``): cells numbered 1..9 row-major, as TextArena does.
CELL_NUMBERS = tuple(str(cell + 1) for cell in range(9))
HOW_TO_PLAY_NUMBERS = (
    "X moves first. Get three of your marks in a row, column or diagonal to win. Cells are numbered 1-9, row by "
    "row from the top left; the board shows the number of every empty cell."
)

_LETTER_DIGIT = re.compile(r"([ABC])\s*([123])")
_DIGIT_LETTER = re.compile(r"([123])\s*([ABC])")
_ROW_COL = re.compile(r"\(?\s*([123])\s*,\s*([123])\s*\)?")


@cache
def winner(board: str) -> str | None:
    """``"X"`` or ``"O"`` if that mark has three in a row, ``"draw"`` on a full board, else None."""
    for a, b, c in LINES:
        mark = board[a]
        if mark != "." and mark == board[b] == board[c]:
            return mark
    return "draw" if "." not in board else None


def to_move(board: str) -> str:
    return "X" if board.count("X") == board.count("O") else "O"


@cache
def legal_moves(board: str) -> tuple[int, ...]:
    return tuple(i for i, mark in enumerate(board) if mark == ".")


def play(board: str, cell: int, mark: str) -> str:
    return board[:cell] + mark + board[cell + 1 :]


# Exact spellings looked up directly; anything else (inner spaces, parentheses) goes through the regexes.
_CELL_SPELLINGS = {
    spelling: 3 * r + c
    for r, row in enumerate(ROWS)
    for c, col in enumerate("123")
    for spelling in (f"{row}{col}", f"{col}{row}", f"{r + 1},{col}", str(3 * r + c + 1))
}


def parse_cell(text: str) -> int | None:
    """Cell index 0..8 from ``B2``/``b2``/``2B``, ``2,2`` (row, column) or a cell number ``1``..``9``."""
    text = text.strip().upper()
    cell = _CELL_SPELLINGS.get(text)
    if cell is not None or len(text) > 12:
        return cell
    if match := _LETTER_DIGIT.fullmatch(text):
        return ROWS.index(match[1]) * 3 + int(match[2]) - 1
    if match := _DIGIT_LETTER.fullmatch(text):
        return ROWS.index(match[2]) * 3 + int(match[1]) - 1
    if match := _ROW_COL.fullmatch(text):
        return (int(match[1]) - 1) * 3 + int(match[2]) - 1
    return None


def read_move(action: str, board: str, names: tuple[str, ...] = CELL_NAMES) -> tuple[int | None, str | None]:
    """The cell of the last ``<move>...</move>`` in a player's turn: ``(cell, None)`` when that cell is free
    on ``board``, else ``(None, reason)`` with a sentence telling the player what is wrong (cells called by
    ``names``: ``CELL_NAMES`` or ``CELL_NUMBERS``). Every spelling of ``parse_cell`` is accepted either way."""
    example = names[4]
    content = extract_tag(action, "move", last=True)
    if content is None:
        return None, f"No move found: put your move inside <move></move>, for example <move>{example}</move>."
    cell = parse_cell(content)
    if cell is None:
        hint = "a cell number 1-9" if names == CELL_NUMBERS else "a row letter and column number"
        return None, f"{content[:40]!r} is not a cell: use {hint} such as {example}."
    if board[cell] != ".":
        return None, f"{names[cell]} is already taken."
    return cell, None


@cache
def render_board(board: str) -> str:
    """The board with coordinates, e.g.::

          1 2 3
        A X . .
        B . O .
        C . . .
    """
    lines = ["  1 2 3"]
    for r, row in enumerate(ROWS):
        lines.append(f"{row} " + " ".join(board[3 * r : 3 * r + 3]))
    return "\n".join(lines)


@cache
def render_numbered_board(board: str) -> str:
    """The board with every empty cell showing its number (TextArena's style), e.g.::

        X 2 3
        4 O 6
        7 8 9
    """
    cells = [mark if mark != "." else str(cell + 1) for cell, mark in enumerate(board)]
    return "\n".join(" ".join(cells[3 * r : 3 * r + 3]) for r in range(3))


@cache
def _value(board: str) -> int:
    """Minimax value for the player to move: >0 win, 0 draw, <0 loss; faster wins score higher."""
    result = winner(board)
    if result == "draw":
        return 0
    if result is not None:  # the previous mover won
        return -(1 + board.count("."))
    mark = to_move(board)
    return max(-_value(play(board, cell, mark)) for cell in legal_moves(board))


@cache
def optimal_moves(board: str) -> tuple[int, ...]:
    """Every move that keeps the minimax value for the player to move (the game must not be over)."""
    mark = to_move(board)
    scored = [(-_value(play(board, cell, mark)), cell) for cell in legal_moves(board)]
    best = max(score for score, _ in scored)
    return tuple(cell for score, cell in scored if score == best)
