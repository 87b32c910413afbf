"""Split without communication ("no-press"): PettingZoo module (``parallel_env()``, ``env()``, ``raw_env``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from rl_llm import checks
from rl_llm.envs.social.base import AGENTS, module_constructors
from rl_llm.envs.social.negotiation import Bundle, NegotiationEnv, equal_totals, format_bundle

ITEMS = ("hats", "books", "balls")


class raw_env(NegotiationEnv):  # lower-case: PettingZoo's module convention
    """
    ## Description
    Each round two players divide 10 hats, 10 books and 10 balls without talking (the "no-press" Split of
    "Learning Robust Social Strategies with LLMs"). Per-unit values are drawn per round, for each player and
    item independently, from ``value_choices`` ({1, 10}), and redrawn until the players value at least one
    item differently and, with ``equal_totals`` (default, as the paper's simulator: ``same_round_value``,
    which its Split config leaves on), until both players' values add up to the same total, so neither
    player is richer by the draw. Both players see both sets of values. Both then propose, at the same time, how many
    units of each item to keep.

    ## Observation
    Text per agent: the rules once; each round a block ``Round r of n. Items: ...`` with
    ``Your values per unit: hats=10, books=1, balls=10`` and the other player's values; after the proposals a
    summary (values, proposals, units received, points). The prompt is the last line; empty once over.

    ## Action
    ``<propose>hats=10, books=0, balls=5</propose>`` (also ``hats: 10; ...`` or ``10 hats, ...``): a whole
    number 0..``quantity`` for every item. Anything else is invalid and gets a corrective observation; after
    ``max_retries`` invalid retries in a row a proposal to keep nothing is played for the agent.

    ## Rewards
    Per round, per item: proposals that fit (``x0 + x1 <= quantity``) are kept as proposed, otherwise the
    item is shared in proportion ``quantity * x_i / (x0 + x1)``; points = units received x value.

    ## Episode End
    Terminated after ``num_rounds`` rounds; never truncated.

    ## Info
    ``task_id``, ``seed``, ``round``, ``phase`` ("propose"), ``active``, ``invalid_action``, ``metrics``
    (``return``, ``rounds``, ``cooperation_rate`` = share of round-items where the agent asked for no more
    than the welfare-maximising share, ``welfare_efficiency``, ``invalid_actions``, ``default_actions``).

    ## Arguments
    - ``num_rounds`` (10), ``items`` (hats, books, balls), ``quantity`` (10), ``value_choices`` ((1, 10)),
      ``equal_totals`` (True), ``max_retries`` (2), ``render_mode``.

    ## Version History
    - v0: initial release. ``equal_totals`` added (on by default, as in the paper's simulator).
    """

    metadata: ClassVar[dict[str, Any]] = {**NegotiationEnv.metadata, "name": "split_v0"}
    stop = ("</propose>",)
    values_public = True

    def __init__(
        self,
        num_rounds: int = 10,
        items: Sequence[str] = ITEMS,
        quantity: int = 10,
        value_choices: Sequence[float] = (1, 10),
        equal_totals: bool = True,
        max_retries: int = 2,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(items=items, quantity=quantity, messages=False, num_rounds=num_rounds,
                         max_retries=max_retries, max_message_chars=1, render_mode=render_mode)
        if isinstance(value_choices, str) or not isinstance(value_choices, Iterable):
            raise ValueError(f"value_choices must be a list of numbers, got {value_choices!r}")
        self.value_choices = tuple(checks.reward(f"value_choices[{i}]", v) for i, v in enumerate(value_choices))
        if len(set(self.value_choices)) < 2:
            raise ValueError(f"value_choices needs at least two different values, got {value_choices!r}")
        self.equal_totals = checks.flag("equal_totals", equal_totals)

    def _sample_values(self) -> dict[str, Bundle]:
        # Redraw until the players disagree on at least one item and, with equal_totals, their totals match
        # (a draw with the two rows swapped item by item qualifies, so a few draws suffice).
        while True:
            draw = self.rng.choice(self.value_choices, size=(len(AGENTS), len(self.items))).tolist()
            values = {agent: dict(zip(self.items, row, strict=True)) for agent, row in zip(AGENTS, draw, strict=True)}
            if draw[0] != draw[1] and (not self.equal_totals or equal_totals(values)):
                return values

    def _rules(self) -> str:
        return (
            f"You and another player split items over {self.num_rounds} rounds. Each round there are "
            f"{self.quantity} units of each item ({', '.join(self.items)}), and each of you has a value per unit "
            "for each item; you both see both players' values. You cannot talk. Each round you both propose, at "
            "the same time, how many units of each item you want to keep. For each item, if the two proposals "
            f"add up to at most {self.quantity}, each player keeps what they proposed; otherwise the "
            f"{self.quantity} units are shared in proportion to the proposals. Your points for a round are the "
            "units you receive times your values. Your goal is to score as many points as possible over all "
            f"rounds. Example proposal: <propose>{format_bundle(dict.fromkeys(self.items, 5))}</propose>."
        )

    @property
    def task_name(self) -> str:
        return f"split_v0-r{self.num_rounds}" + ("" if self.equal_totals else "-unequal")


parallel_env, env = module_constructors(raw_env)
