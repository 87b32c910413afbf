"""Tic-tac-toe against a built-in opponent, played through text."""

from __future__ import annotations

from functools import cache
from typing import Any

from rl_llm import checks
from rl_llm.envs.base import Outcome, Task, TextEnv
from rl_llm.envs.tictactoe.rules import (
    CELL_NAMES,
    CELL_NUMBERS,
    EMPTY_BOARD,
    HOW_TO_PLAY,
    HOW_TO_PLAY_NUMBERS,
    legal_moves,
    optimal_moves,
    play,
    read_move,
    render_board,
    render_numbered_board,
    winner,
)

OPPONENTS = {"random": 0.0, "minimax": 1.0, "mixed": None}
# cell_names -> (the cells' names, how the board is drawn, the rules sentence)
NAMINGS = {
    "letters": (CELL_NAMES, render_board, HOW_TO_PLAY),
    "numbers": (CELL_NUMBERS, render_numbered_board, HOW_TO_PLAY_NUMBERS),
}


@cache
def _board_prompt(board: str, mark: str, show_legal_moves: bool, cell_names: str) -> str:
    names, render, _ = NAMINGS[cell_names]
    lines = [render(board), f"You play {mark}."]
    if show_legal_moves:
        lines.append("Legal moves: " + ", ".join(names[c] for c in legal_moves(board)))
    lines.append("Your move?")
    return "\n".join(lines)


class TicTacToeEnv(TextEnv):
    """
    ## Description
    The agent plays tic-tac-toe as X or O against a built-in opponent: ``random`` (uniform legal moves),
    ``minimax`` (perfect play, uniform among optimal moves) or ``mixed`` (minimax with probability
    ``opponent_skill``, else random). X moves first.

    ## Observation
    The board with coordinates (rows A-C, columns 1-3; ``.`` is empty), the agent's mark, the opponent's
    last move and, with ``show_legal_moves``, the list of legal cells. With ``cell_names="numbers"`` cells are
    called 1..9 (row-major) instead, and the board shows the number of each empty cell (TextArena's style)::

        X 2 3
        4 O 6
        7 8 9

    ## Action
    The cell inside ``<move></move>``: ``<move>B2</move>``, also ``2B``, ``2,2`` (row, column) or a cell
    number 1..9 (row-major, 1 = A1), whatever ``cell_names`` is. With several tags the last one counts. An
    unparseable move or an occupied cell is illegal: the board does not change, the agent is told why and may
    try again.

    ## Rewards
    ``outcome``: +1 win, 0 draw, -1 loss, on the final step. ``illegal_move``: ``-illegal_move_penalty``
    on every illegal move. ``info["metrics"]``: ``illegal_moves``, ``moves``, and ``win``/``draw``/``loss``
    (1.0 for the final result, otherwise 0).

    ## Episode End
    Terminated when the game is won, drawn or lost; more than ``max_illegal_moves`` illegal moves in a row
    lose the game. Truncated after ``max_turns`` turns (default ``5 * (max_illegal_moves + 1)``, which a
    game cannot exceed).

    ## Arguments
    - ``agent_mark`` ("random"): ``"X"``, ``"O"`` or ``"random"`` (drawn per episode).
    - ``opponent`` ("random"): ``"random"``, ``"minimax"`` or ``"mixed"``; ``opponent_skill`` (0.5) for mixed.
    - ``illegal_move_penalty`` (0.1), ``max_illegal_moves`` (3), ``show_legal_moves`` (True), ``max_turns``.
    - ``cell_names`` ("letters"): ``"letters"`` (A1..C3) or ``"numbers"`` (1..9, one token per move for most
      tokenizers: what the tiny model's TicTacToe training config uses).

    ## Version History
    - v0: initial release; ``cell_names`` added later (the default keeps the original observations).
    """

    reset_options = frozenset({"agent_mark"})

    stop = ("</move>",)

    def __init__(
        self,
        agent_mark: str = "random",
        opponent: str = "random",
        opponent_skill: float = 0.5,
        illegal_move_penalty: float = 0.1,
        max_illegal_moves: int = 3,
        show_legal_moves: bool = True,
        max_turns: int | None = None,
        cell_names: str = "letters",
        render_mode: str | None = None,
    ) -> None:
        if agent_mark not in ("X", "O", "random"):
            raise ValueError(f"agent_mark must be 'X', 'O' or 'random', got {agent_mark!r}")
        if opponent not in OPPONENTS:
            raise ValueError(f"opponent must be one of {tuple(OPPONENTS)}, got {opponent!r}")
        opponent_skill = checks.real("opponent_skill", opponent_skill, minimum=0.0, maximum=1.0)
        if cell_names not in NAMINGS:
            raise ValueError(f"cell_names must be one of {tuple(NAMINGS)}, got {cell_names!r}")
        max_illegal_moves = checks.integer("max_illegal_moves", max_illegal_moves, minimum=0)
        illegal_move_penalty = checks.reward("illegal_move_penalty", illegal_move_penalty, minimum=0.0)
        show_legal_moves = checks.flag("show_legal_moves", show_legal_moves)
        if max_turns is None:
            max_turns = 5 * (max_illegal_moves + 1)
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self.agent_mark_arg = agent_mark
        self.opponent = opponent
        skill = OPPONENTS[opponent]
        self.opponent_skill = opponent_skill if skill is None else skill
        self.illegal_move_penalty = float(illegal_move_penalty)
        self.max_illegal_moves = max_illegal_moves
        self.show_legal_moves = show_legal_moves
        self.cell_names = cell_names
        self.names, self._draw_board, self.how_to_play = NAMINGS[cell_names]

    def _reset(self, options: dict[str, Any]) -> Task:
        # A scalar draw is the cheapest way to name the episode (Generator.integers costs ~10x more).
        episode_seed = int(self.np_random.random() * 2**31)
        mark = options.get("agent_mark", self.agent_mark_arg)
        if isinstance(mark, str) and mark == "random":  # only a str: np.array(["X"]) passed `in`, then failed
            mark = "X" if self.np_random.random() < 0.5 else "O"
        if not isinstance(mark, str) or mark not in ("X", "O"):
            raise ValueError(f"options['agent_mark'] must be 'X', 'O' or 'random', got {mark!r}")
        self.agent_mark, self.opponent_mark = mark, ("O" if mark == "X" else "X")
        self.board = EMPTY_BOARD
        self.moves = self.illegal_moves = self.illegal_streak = 0
        opening = ""
        if self.opponent_mark == "X":
            opening = self._opponent_move()
        system_prompt = (
            f"You are playing tic-tac-toe as {self.agent_mark} against an opponent playing {self.opponent_mark}. "
            f"{self.how_to_play} Each turn, answer with your move inside <move></move>, for example "
            f"<move>{self.names[4]}</move>."
        )
        task_id = f"TicTacToe-{self.agent_mark}-{self.opponent}{self.opponent_skill:g}-{episode_seed}"
        return Task(observation=self._observation(opening), task_id=task_id, system_prompt=system_prompt)

    def _opponent_move(self) -> str:
        rng = self.np_random
        choices = optimal_moves(self.board) if rng.random() < self.opponent_skill else legal_moves(self.board)
        cell = choices[int(rng.random() * len(choices))]
        self.board = play(self.board, cell, self.opponent_mark)
        return f"The opponent played {self.names[cell]}."

    def _observation(self, message: str) -> str:
        body = _board_prompt(self.board, self.agent_mark, self.show_legal_moves, self.cell_names)
        return f"{message}\n{body}" if message else body

    def _metrics(self, result: str | None) -> dict[str, float]:
        return {
            "illegal_moves": float(self.illegal_moves),
            "moves": float(self.moves),
            "win": float(result == self.agent_mark),
            "draw": float(result == "draw"),
            "loss": float(result == self.opponent_mark),
        }

    def _step(self, action: str) -> Outcome:
        cell, reason = read_move(action, self.board, self.names)
        if cell is None:
            return self._illegal(reason)
        self.illegal_streak = 0
        self.moves += 1
        self.board = play(self.board, cell, self.agent_mark)
        message = ""
        result = winner(self.board)
        if result is None:
            message = self._opponent_move()
            result = winner(self.board)
        if result is None:
            return Outcome(self._observation(message), {"outcome": 0.0}, metrics=self._metrics(None))
        outcome = 1.0 if result == self.agent_mark else (-1.0 if result == self.opponent_mark else 0.0)
        verdict = {1.0: "You won!", 0.0: "The game is a draw.", -1.0: "You lost."}[outcome]
        final = f"{message}\n{self._draw_board(self.board)}\n{verdict}".lstrip()
        return Outcome(final, {"outcome": outcome}, terminated=True, metrics=self._metrics(result))

    def _illegal(self, reason: str) -> Outcome:
        self.illegal_moves += 1
        self.illegal_streak += 1
        rewards = {"outcome": 0.0, "illegal_move": -self.illegal_move_penalty}
        if self.illegal_streak > self.max_illegal_moves:
            rewards["outcome"] = -1.0
            message = f"{reason}\nToo many illegal moves in a row: you lose."
            return Outcome(message, rewards, terminated=True, invalid_action=True, metrics=self._metrics(self.opponent_mark))
        left = self.max_illegal_moves - self.illegal_streak + 1
        message = f"Illegal move. {reason} The board is unchanged ({left} more illegal moves in a row lose)."
        return Outcome(self._observation(message), rewards, invalid_action=True, metrics=self._metrics(None))
