"""Iterated 2x2 matrix games played by text: the shared base of the prisoner's dilemma, stag hunt and chicken.

Each round both players simultaneously write ``<A>`` or ``<B>``; ``A`` is the cooperative action in every
game here. Payoffs follow the classic R/S/T/P naming from the row player's point of view.

A reply may reason in free text first; the move is the *last* ``<A>`` or ``<B>`` in it, and the prompt says
so. There are no stop strings: stopping generation at the first ``<A>``/``<B>`` would commit a move the
moment the model merely mentions a tag while thinking ("if I play <B> ..."). With ``max_retries=0`` and a
generator constrained to ``<A>|<B>`` the paper's exact protocol is recovered.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass
from typing import Any, ClassVar

from rl_llm import checks
from rl_llm.envs.social.base import AGENTS, SocialEnv, number, other, points_text

ACTIONS = ("A", "B")
COOPERATE = "A"


@dataclass(frozen=True)
class Payoffs:
    """Points for the player whose move is first: ``reward`` (A vs A), ``sucker`` (A vs B),
    ``temptation`` (B vs A) and ``punishment`` (B vs B)."""

    reward: float
    sucker: float
    temptation: float
    punishment: float

    def points(self, mine: str, theirs: str) -> float:
        table = {("A", "A"): self.reward, ("A", "B"): self.sucker, ("B", "A"): self.temptation,
                 ("B", "B"): self.punishment}
        return float(table[mine, theirs])

    @classmethod
    def of(cls, value: Payoffs | Sequence[float]) -> Payoffs:
        """Accept a ``Payoffs`` or a sequence ``(R, S, T, P)`` (convenient from YAML or the command line)."""
        if isinstance(value, Payoffs):
            return value
        values = list(value) if isinstance(value, Iterable) and not isinstance(value, str) else []
        if len(values) != 4:
            raise ValueError(f"payoffs must be a Payoffs or four numbers (R, S, T, P), got {value!r}")
        return cls(*(checks.reward(f"payoffs[{index}]", v) for index, v in enumerate(values)))


def parse_choice(text: str) -> tuple[str | None, str | None]:
    """``("A", None)`` or ``("B", None)`` for the last ``<A>``/``<B>`` in the reply, else ``(None, reason)``."""
    positions = {action: text.rfind(f"<{action}>") for action in ACTIONS}
    last = max(ACTIONS, key=positions.__getitem__)
    if positions[last] < 0:
        return None, "no <A> or <B> found; end your reply with your move, <A> or <B>."
    return last, None


class MatrixGameEnv(SocialEnv):
    """An iterated 2x2 game; subclasses fix the name and the default payoffs (see their docstrings)."""

    default_payoffs: ClassVar[Payoffs]
    stop = ()  # the move is the last tag of the reply: see the module docstring

    def __init__(
        self,
        payoffs: Payoffs | Sequence[float] | None = None,
        num_rounds: int = 10,
        max_retries: int = 2,
        default_action: str = "B",
        render_mode: str | None = None,
    ) -> None:
        super().__init__(num_rounds=num_rounds, max_retries=max_retries, render_mode=render_mode)
        if default_action not in ACTIONS:
            raise ValueError(f"default_action must be 'A' or 'B', got {default_action!r}")
        self.payoffs = Payoffs.of(self.default_payoffs if payoffs is None else payoffs)
        self.default_action = default_action

    def _start(self, options: dict[str, Any]) -> str:
        self.history: list[tuple[str, str]] = []  # (player_0's move, player_1's move) per round
        p = self.payoffs
        rows = [(mine, theirs) for mine in ACTIONS for theirs in ACTIONS]
        table = "\n".join(
            f"- you {mine}, the other player {theirs}: you get {points_text(p.points(mine, theirs))}, "
            f"the other player gets {points_text(p.points(theirs, mine))}"
            for mine, theirs in rows
        )
        return (
            f"You are playing a game with another player for {self.num_rounds} rounds. In each round you both "
            "choose an action, A or B, at the same time, without seeing the other player's choice.\n"
            f"Points per round:\n{table}\n"
            "Your goal is to score as many points as possible over all rounds. To play A, write <A>; to play B, "
            "write <B>. You may think it over in words first, but end your reply with your move: only the last "
            "<A> or <B> in your reply counts."
        )

    def _phase(self) -> tuple[str, tuple[str, ...]]:
        return "play", AGENTS

    def _prompt(self, agent: str) -> str:
        return f"Round {self.round} of {self.num_rounds}: play <A> or <B> (the last one in your reply counts)."

    def _parse(self, agent: str, text: str) -> tuple[Any, str | None]:
        return parse_choice(text)

    def _default(self, agent: str) -> tuple[Any, str]:
        return self.default_action, f"<{self.default_action}>"

    def _resolve(self, actions: dict[str, Any]) -> dict[str, float]:
        self.history.append((actions[AGENTS[0]], actions[AGENTS[1]]))
        rewards = {}
        for agent in AGENTS:
            mine, theirs = actions[agent], actions[other(agent)]
            rewards[agent] = self.payoffs.points(mine, theirs)
            self._tell(
                agent,
                f"Round {self.round} result: you played {mine}, the other player played {theirs}. "
                f"You scored {points_text(rewards[agent])}, the other player scored "
                f"{points_text(self.payoffs.points(theirs, mine))}.",
            )
        self._transcript.append(f"[round {self.round}] moves {self.history[-1]}, points {rewards}")
        self.round += 1
        return rewards

    def _game_metrics(self, agent: str) -> dict[str, float]:
        seat = AGENTS.index(agent)
        moves = [pair[seat] for pair in self.history]
        return {"cooperation_rate": moves.count(COOPERATE) / len(moves) if moves else 0.0}

    @property
    def task_name(self) -> str:
        return f"{self.metadata['name']}-{'_'.join(number(v) for v in astuple(self.payoffs))}-r{self.num_rounds}"
