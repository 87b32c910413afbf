"""Two-player tic-tac-toe by text: PettingZoo module (``env()`` native AEC, ``parallel_env()``, ``raw_env``)."""

from __future__ import annotations

from typing import Any, ClassVar

from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.conversions import turn_based_aec_to_parallel_wrapper
from pettingzoo.utils.wrappers import OrderEnforcingWrapper

from rl_llm import checks
from rl_llm.envs.parsing import truncate_middle
from rl_llm.envs.social.base import (
    AGENTS,
    TRANSCRIPT_ACTION_CHARS,
    ObservationText,
    TwoPlayerTextGame,
    check_action,
    check_parallel_actions,
    other,
    plural,
)
from rl_llm.envs.tictactoe.rules import (
    CELL_NAMES,
    CELL_NUMBERS,
    EMPTY_BOARD,
    HOW_TO_PLAY,
    HOW_TO_PLAY_NUMBERS,
    legal_moves,
    play,
    read_move,
    render_board,
    render_numbered_board,
    winner,
)

MARKS = {AGENTS[0]: "X", AGENTS[1]: "O"}


def _rules(how_to_play: str, example: str) -> str:
    return (f"You are playing tic-tac-toe against another player. {how_to_play} On your turn, answer with your "
            f"move inside <move></move>, for example <move>{example}</move>.")  # fmt: skip


RULES = _rules(HOW_TO_PLAY, "B2")
# cell_names -> (the cells' names, how the board is drawn, the rules), as the single-agent TicTacToe-v0's
NAMINGS = {
    "letters": (CELL_NAMES, render_board, RULES),
    "numbers": (CELL_NUMBERS, render_numbered_board, _rules(HOW_TO_PLAY_NUMBERS, "5")),
}


class raw_env(TwoPlayerTextGame, AECEnv[str, str, str]):  # lower-case: PettingZoo's module convention
    """
    ## Description
    Two agents play tic-tac-toe: ``player_0`` is X and moves first, ``player_1`` is O (swap seats to swap
    marks). Rules and the solver are shared with the single-agent ``rl-llm/TicTacToe-v0``.

    ## Observation
    Text per agent: the rules once, then the other player's last move, the board with coordinates, the
    agent's mark, the legal moves (``show_legal_moves``) and a prompt on the agent's turn, or a note that it
    is waiting. Empty once the game is over.

    ## Action
    The cell inside ``<move></move>``: ``<move>B2</move>``, also ``2B``, ``2,2`` or a cell number 1..9. With
    several tags the last one counts. An unparseable move or an occupied cell is invalid: the board does not
    change, the agent is told why and moves again; after ``max_retries`` invalid retries in a row a random
    legal move (from the seeded game generator) is played for it.

    ## Rewards
    +1 win, -1 loss, 0 draw on the final step; ``-illegal_move_penalty`` on every invalid move.

    ## Episode End
    Terminated for both agents when the game is won or drawn; never truncated.

    ## Info
    ``task_id``, ``seed``, ``active`` (whether it is the agent's turn), ``invalid_action``, ``metrics``
    (``return``, ``moves``, ``invalid_actions``, ``default_actions``, ``win``, ``draw``, ``loss``); on reset
    also ``system_prompt`` and ``stop``.

    ## Arguments
    - ``max_retries`` (2), ``illegal_move_penalty`` (0.0), ``show_legal_moves`` (True), ``render_mode``.
    - ``cell_names`` ("letters"): ``"letters"`` (A1..C3) or ``"numbers"`` (1..9 row-major, the board showing
      each empty cell's number; one token per move for most tokenizers), as ``rl-llm/TicTacToe-v0``'s.

    ## Version History
    - v0: initial release; ``cell_names`` added later (the default keeps the original observations).
    """

    metadata: ClassVar[dict[str, Any]] = {
        "render_modes": ["ansi", "human"], "name": "tictactoe_v0", "is_parallelizable": False,
    }
    stop: ClassVar[tuple[str, ...]] = ("</move>",)

    def __init__(
        self,
        max_retries: int = 2,
        illegal_move_penalty: float = 0.0,
        show_legal_moves: bool = True,
        render_mode: str | None = None,
        cell_names: str = "letters",
    ) -> None:
        super().__init__()
        if cell_names not in NAMINGS:
            raise ValueError(f"tictactoe_v0: cell_names must be one of {sorted(NAMINGS)}, got {cell_names!r}")
        self.cell_names, self._render, self.rules = NAMINGS[cell_names]
        self._setup(max_retries=max_retries, render_mode=render_mode)
        self.illegal_move_penalty = checks.reward("illegal_move_penalty", illegal_move_penalty, minimum=0.0)
        self.show_legal_moves = checks.flag("show_legal_moves", show_legal_moves)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        """Start a game. ``options`` are ignored."""
        self._seed_episode(seed)
        self.board = EMPTY_BOARD
        self.agents = list(AGENTS)
        self.agent_selection = AGENTS[0]
        self.rewards = dict.fromkeys(AGENTS, 0.0)
        self._cumulative_rewards = dict.fromkeys(AGENTS, 0.0)
        self.terminations = dict.fromkeys(AGENTS, False)
        self.truncations = dict.fromkeys(AGENTS, False)
        self._reset_counters()
        self._moves = dict.fromkeys(AGENTS, 0)
        self.result: str | None = None
        self._observations = {agent: f"{self.rules}\n\n{self._board_text(agent)}" for agent in AGENTS}
        self.infos = {agent: self._info(agent, invalid=False) for agent in AGENTS}
        for agent in AGENTS:
            system_prompt = f"You are {agent}, playing {MARKS[agent]} in a game of tic-tac-toe against another player."
            self.infos[agent].update(system_prompt=system_prompt, stop=list(self.stop))
        self._transcript = [f"[rules]\n{self.rules}", self._render(self.board)]
        self._printed = 0
        self._echo()

    def observe(self, agent: str) -> ObservationText:
        return ObservationText(self._observations[agent])

    def step(self, action: str | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        check_action("tictactoe_v0", action)
        self._cumulative_rewards[agent] = 0.0
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._transcript.append(f"[{agent}]\n{truncate_middle(action, TRANSCRIPT_ACTION_CHARS)}")
        cell, reason = read_move(action, self.board, self.cell_names)
        note = ""
        if cell is None:
            left = self._count_invalid(agent)
            self.rewards[agent] = -self.illegal_move_penalty
            if left:
                self._observations[agent] = (f"Illegal move. {reason} The board is unchanged ({plural(left, 'more illegal move')} "
                                             f"and a random move is played for you).\n\n{self._board_text(agent)}")
                self._finish_step(agent, invalid=True)
                return
            choices = legal_moves(self.board)
            cell = int(choices[self.rng.integers(len(choices))])
            note = f"Illegal move. {reason} Too many illegal moves: {self.cell_names[cell]} was played for you.\n\n"
        self._streak[agent] = 0
        self._moves[agent] += 1
        self.board = play(self.board, cell, MARKS[agent])
        self._transcript.append(f"{agent} plays {self.cell_names[cell]}\n{self._render(self.board)}")
        self.result = winner(self.board)
        them = other(agent)
        if self.result is not None:
            for player in AGENTS:
                outcome = 0.0 if self.result == "draw" else (1.0 if self.result == MARKS[player] else -1.0)
                self.rewards[player] += outcome
                self.terminations[player] = True
                self._observations[player] = ""
            self._transcript.append(f"[result] {self.result}")
        else:
            self.agent_selection = them
            news = f"The other player ({MARKS[agent]}) played {self.cell_names[cell]}."
            first_turn = self._moves[them] == 0 and self._invalid[them] == 0
            rules = f"{self.rules}\n\n" if first_turn else ""  # O's first turn: it has not seen the rules yet
            self._observations[them] = f"{rules}{news}\n\n{self._board_text(them)}"
            self._observations[agent] = note + self._board_text(agent)
        self._finish_step(agent, invalid=bool(note))

    def _finish_step(self, agent: str, *, invalid: bool) -> None:
        for player, reward in self.rewards.items():
            self._returns[player] += reward
        self.infos = {player: self._info(player, invalid=invalid and player == agent) for player in self.agents}
        self._accumulate_rewards()
        self._echo()

    def _board_text(self, agent: str) -> str:
        lines = [self._render(self.board), f"You play {MARKS[agent]}."]
        if agent != self.agent_selection:
            lines.append(f"Waiting for the other player ({MARKS[other(agent)]}) to move.")
            return "\n".join(lines)
        if self.show_legal_moves:
            lines.append("Legal moves: " + ", ".join(self.cell_names[c] for c in legal_moves(self.board)))
        lines.append("Your move: answer with <move>CELL</move>.")
        return "\n".join(lines)

    def _info(self, agent: str, *, invalid: bool) -> dict[str, Any]:
        mark = MARKS[agent]
        return {
            "task_id": f"tictactoe_v0-{self.episode_seed}",
            "seed": self.episode_seed,
            "active": self.result is None and agent == self.agent_selection,
            "invalid_action": invalid,
            "metrics": {
                "return": self._returns[agent],
                "moves": float(self._moves[agent]),
                **self._try_metrics(agent),
                "win": float(self.result == mark),
                "draw": float(self.result == "draw"),
                "loss": float(self.result not in (None, "draw", mark)),
            },
        }


def env(**kwargs: Any) -> AECEnv:
    """The native AEC game, with PettingZoo's order-enforcing wrapper."""
    return OrderEnforcingWrapper(raw_env(**kwargs))


class CheckedTurnBasedParallel(turn_based_aec_to_parallel_wrapper):
    """PettingZoo's ``turn_based_aec_to_parallel`` converter, checking ``actions`` as the other games' parallel
    step does. It read ``actions[agent_selection]`` unchecked: None raised "not subscriptable", a missing agent
    a KeyError, a misspelt name was ignored, and a step after the game returned four empty dicts."""

    def step(self, actions: Any) -> tuple[dict, dict, dict, dict, dict]:
        if not getattr(self, "agents", None):
            raise RuntimeError("tictactoe_v0: the game has ended (or never started); call reset()")
        check_parallel_actions("tictactoe_v0", actions, [self.aec_env.agent_selection])
        return super().step(actions)


def parallel_env(**kwargs: Any) -> ParallelEnv:
    """A parallel view through PettingZoo's ``turn_based_aec_to_parallel`` (``CheckedTurnBasedParallel``):
    every step only the agent whose turn it is (``info["active"]``) is read."""
    return CheckedTurnBasedParallel(env(**kwargs))
