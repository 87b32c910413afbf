"""Trust-and-Split, classic and rock-paper-scissors variants: PettingZoo module (``parallel_env()``,
``env()`` for AEC, ``raw_env``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from rl_llm import checks
from rl_llm.envs.social.base import AGENTS, module_constructors, other, points_text
from rl_llm.envs.social.negotiation import Bundle, NegotiationEnv, equal_totals, format_bundle

VARIANTS = ("classic", "rps")
HANDS = ("rock", "paper", "scissors")
BEATS = {"rock": "scissors", "paper": "rock", "scissors": "paper"}  # hand -> the hand it beats
CLASSIC_ITEMS = ("hats", "books")


class raw_env(NegotiationEnv):  # lower-case: PettingZoo's module convention
    """
    ## Description
    Trust-and-Split ("Learning Robust Social Strategies with LLMs"): each round the two players first send
    one natural-language message each (the player who speaks first alternates between rounds; round 1's is
    drawn from the seed), then propose at the same time how much of each item to keep. Values are private
    during the round, so cooperating needs trust: telling the truth about one's values and conceding items
    the other values more.

    - ``variant="classic"``: 10 hats and 10 books; per-unit values drawn per round, independently for each
      player and item, uniformly from the integers ``value_range`` (1..20); with ``equal_totals`` (default,
      as the paper's simulator, ``same_round_value``) redrawn until both players' values add up to the same
      total.
    - ``variant="rps"`` (the paper's main game): 10 coins; each player gets a different rock/paper/scissors
      hand; the winning hand values coins at ``high_value`` (10) per coin, the losing hand at ``low_value``
      (1). A player sees only its own hand, so it knows its value only once it learns the other's hand.

    ## Observation
    Text per agent: the rules once; each round ``Round r of n. Items: ...`` with the agent's private
    information (``Your values per unit: hats=7, books=15`` or ``Your hand: rock``) and who speaks first;
    the other player's message as quoted lines (``> ...``); after the proposals a summary revealing both
    players' values (and hands), proposals, units received and points. The prompt is the last line; an agent
    that must wait is told so (its reply is then ignored and its info has ``active: False``). Empty once over.

    ## Action
    Message phase (only the speaker acts): ``<message>...</message>``, cut to ``max_message_chars`` (500).
    Proposal phase (both act): ``<propose>7</propose>`` (rps) or ``<propose>hats=3, books=10</propose>``.
    Anything else is invalid and gets a corrective observation; after ``max_retries`` invalid retries in a
    row the default is played for the agent: an empty message, or a proposal to keep nothing.

    ## Rewards
    After the proposals, per item: proposals that fit are kept, otherwise the item is shared in proportion
    ``quantity * x_i / (x0 + x1)``; points = units received x per-unit value. Zero on message steps.

    ## Episode End
    Terminated after ``num_rounds`` rounds (3 steps per round when every action is valid); never truncated.

    ## Info
    ``task_id``, ``seed``, ``round``, ``phase`` ("message" or "propose"), ``active``, ``invalid_action``,
    ``metrics`` (``return``, ``rounds``, ``cooperation_rate``, ``welfare_efficiency``, ``invalid_actions``,
    ``default_actions``); on reset also ``system_prompt`` and ``stop``.

    ## Arguments
    - ``variant`` ("classic" or "rps"), ``num_rounds`` (10), ``max_message_chars`` (500), ``max_retries`` (2),
      ``value_range`` ((1, 20), classic), ``equal_totals`` (True, classic), ``high_value`` (10) and ``low_value`` (1) (rps), ``render_mode``.

    ## Version History
    - v0: initial release. ``equal_totals`` added for classic (on by default, as in the paper's simulator).
    """

    metadata: ClassVar[dict[str, Any]] = {**NegotiationEnv.metadata, "name": "trust_and_split_v0"}

    def __init__(
        self,
        variant: str = "classic",
        num_rounds: int = 10,
        max_message_chars: int = 500,
        max_retries: int = 2,
        value_range: Sequence[int] = (1, 20),
        equal_totals: bool = True,
        high_value: float = 10,
        low_value: float = 1,
        render_mode: str | None = None,
    ) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        items = ("coins",) if variant == "rps" else CLASSIC_ITEMS
        super().__init__(items=items, quantity=10, messages=True, num_rounds=num_rounds, max_retries=max_retries,
                         max_message_chars=max_message_chars, render_mode=render_mode)
        bounds = list(value_range) if isinstance(value_range, Iterable) and not isinstance(value_range, str) else []
        if len(bounds) != 2:
            raise ValueError(f"value_range must be (low, high) with 0 <= low <= high, got {value_range!r}")
        low = checks.integer("value_range[0]", bounds[0], maximum=int(checks.MAX_REWARD))
        high = checks.integer("value_range[1]", bounds[1], minimum=low, maximum=int(checks.MAX_REWARD))
        low_value = checks.reward("low_value", low_value, minimum=0.0)
        high_value = checks.reward("high_value", high_value, minimum=0.0)
        if not low_value < high_value:
            raise ValueError(f"need 0 <= low_value < high_value, got {low_value}, {high_value}")
        self.variant = variant
        self.value_range = (low, high)
        self.equal_totals = checks.flag("equal_totals", equal_totals)
        self.high_value, self.low_value = high_value, low_value

    @property
    def task_name(self) -> str:
        unequal = "-unequal" if self.variant == "classic" and not self.equal_totals else ""
        return f"trust_and_split_v0-{self.variant}-r{self.num_rounds}{unequal}"

    def _sample_values(self) -> dict[str, Bundle]:
        if self.variant == "classic":
            low, high = self.value_range
            while True:  # with equal_totals about 1 draw in 30 qualifies for 2 items over 1..20
                draw = self.rng.integers(low, high + 1, size=(len(AGENTS), len(self.items))).astype(float).tolist()
                values = {agent: dict(zip(self.items, row, strict=True)) for agent, row in zip(AGENTS, draw, strict=True)}
                if not self.equal_totals or equal_totals(values):
                    return values
        first, second = (HANDS[int(i)] for i in self.rng.choice(len(HANDS), size=2, replace=False))
        self.hands = {AGENTS[0]: first, AGENTS[1]: second}
        return {agent: {"coins": self.high_value if BEATS[hand] == self.hands[other(agent)] else self.low_value}
                for agent, hand in self.hands.items()}

    def _private_info(self, agent: str) -> str:
        if self.variant == "classic":
            return super()._private_info(agent)
        return (f"Your hand: {self.hands[agent]}. The other player holds a different hand, which you don't "
                "know yet.")

    def _summary_extra(self, agent: str) -> list[str]:
        if self.variant == "classic":
            return []
        return [f"Hands: you {self.hands[agent]}; the other player {self.hands[other(agent)]}."]

    def _rules(self) -> str:
        if self.variant == "rps":
            stakes = (
                f"Each round there are {self.quantity} coins. Each of you privately gets a different hand of rock, "
                "paper or scissors (rock beats scissors, scissors beats paper, paper beats rock). Coins are worth "
                f"{points_text(self.high_value)} each to the player with the winning hand and "
                f"{points_text(self.low_value)} each to the other. You only see your own hand."
            )
            example = "<propose>5</propose>"
        else:
            low, high = self.value_range
            stakes = (
                f"Each round there are {self.quantity} units of each item ({', '.join(self.items)}). Each of you "
                f"privately gets a value per unit for each item, a whole number from {low} to {high}. You only "
                "see your own values."
            )
            example = f"<propose>{format_bundle(dict.fromkeys(self.items, 5))}</propose>"
        return (
            f"You and another player split items over {self.num_rounds} rounds. {stakes} Each round, you each "
            "first send one message to the other player (who speaks first alternates between rounds), then you "
            "both propose, at the same time, how much of each item you want to keep. For each item, if the two "
            f"proposals add up to at most {self.quantity}, each player keeps what they proposed; otherwise the "
            f"{self.quantity} units are shared in proportion to the proposals. Your points for a round are the "
            "units you receive times your values. After each round both players' values and proposals are "
            "revealed. Your goal is to score as many points as possible over all rounds. Write messages as "
            f"<message>your text</message> and proposals as {example}."
        )


parallel_env, env = module_constructors(raw_env)
