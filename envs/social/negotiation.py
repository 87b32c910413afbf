"""Split games: each round two players divide items they value differently (Split, Trust-and-Split).

Shared by ``split_v0`` (no messages, values public) and ``trust_and_split_v0`` (one message per player per
round, values private). A round is: the players' messages, the speaker alternating between rounds (when the
game has messages), then simultaneous proposals ``<propose>...</propose>`` of how many units of each item
to keep. Allocation rule (per item, ``quantity`` units): proposals that fit are kept as proposed; when
``x0 + x1 > quantity`` the item is shared in proportion, ``q_i = quantity * x_i / (x0 + x1)``. Points are
``q_i * value_i`` summed over the items.

Observation lines that baselines read (each at the start of a line; quoted messages are prefixed ``> ``
so they can never forge one): ``Your values per unit: hats=10, books=1``, ``Your hand: rock``, and after
each round ``Values per unit: you ...; the other player ...`` and ``Proposals: you ...; the other player ...``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from rl_llm import checks
from rl_llm.envs.parsing import extract_tag
from rl_llm.envs.social.base import AGENTS, SocialEnv, number, other

Bundle = dict[str, float]
_SEPARATORS = str.maketrans({",": " ", ";": " ", ":": " ", "=": " "})
# Proposals are small integers; longer digit strings are rejected before int() sees them.
_MAX_DIGITS = 4
# No honest proposal is longer; a longer one is rejected before it is split into tokens.
MAX_PROPOSAL_CHARS = 1000


def allocate(x0: float, x1: float, quantity: float) -> tuple[float, float]:
    """Units each player receives of one item: the proposals if they fit, else a proportional share."""
    if x0 + x1 <= quantity:
        return float(x0), float(x1)
    return quantity * x0 / (x0 + x1), quantity * x1 / (x0 + x1)


def welfare_share(mine: float, theirs: float, quantity: float) -> float:
    """The welfare-maximising share of an item: all of it to the player who values it more, halves on a tie."""
    if mine == theirs:
        return quantity / 2
    return float(quantity) if mine > theirs else 0.0


def equal_totals(values: Mapping[str, Mapping[str, float]]) -> bool:
    """Whether every player's values add up to the same total (the paper simulator's ``same_round_value``)."""
    return len({sum(bundle.values()) for bundle in values.values()}) == 1


def format_bundle(bundle: Mapping[str, float]) -> str:
    """``{"hats": 3, "books": 7}`` -> ``"hats=3, books=7"``."""
    return ", ".join(f"{item}={number(amount)}" for item, amount in bundle.items())


def _item_names(items: Sequence[str]) -> dict[str, str]:
    """Accepted spellings of each item: ``hats``, ``hat`` (any case)."""
    names = {}
    for item in items:
        names[item.lower()] = item
        names[item.lower().removesuffix("s")] = item
    return names


def parse_bundle(text: str, items: Sequence[str], high: int) -> tuple[dict[str, int] | None, str | None]:
    """Whole amounts 0..``high`` for every item, from ``hats=3, books=7``, ``hats: 3; books: 7``,
    ``3 hats, 7 books`` or, with a single item, a bare number. Returns ``(bundle, None)`` or ``(None, reason)``.

    Linear in the length of ``text``: one pass over whitespace-separated tokens.
    """
    names = _item_names(items)
    bundle: dict[str, int] = {}
    pending_item: str | None = None
    pending_amount: int | None = None

    def add(item: str, amount: int) -> str | None:
        if item in bundle:
            return f"{item} appears twice."
        if not 0 <= amount <= high:
            return f"{item}={amount} is outside 0..{high}."
        bundle[item] = amount
        return None

    for token in text.translate(_SEPARATORS).split():
        item = names.get(token.lower())
        if item is not None:
            if pending_item is not None:
                return None, f"{pending_item} has no amount."
            if pending_amount is None:
                pending_item = item
                continue
            error, pending_amount = add(item, pending_amount), None
        elif token.isascii() and token.isdigit():
            if len(token) > _MAX_DIGITS:
                return None, f"{token[:10]}... is outside 0..{high}."
            if pending_item is None and pending_amount is not None:
                return None, "two amounts in a row."
            if pending_item is None:
                pending_amount = int(token)
                continue
            error, pending_item = add(pending_item, int(token)), None
        else:
            return None, f"{token[:20]!r} is neither an item ({', '.join(items)}) nor a whole number."
        if error:
            return None, error
    if pending_amount is not None and len(items) == 1 and not bundle:
        pending_amount, error = None, add(items[0], pending_amount)
        if error:
            return None, error
    if pending_item is not None or pending_amount is not None:
        return None, "every amount needs an item and every item an amount."
    missing = [item for item in items if item not in bundle]
    if missing:
        return None, f"no amount for {', '.join(missing)}."
    return {item: bundle[item] for item in items}, None


def quote(message: str) -> str:
    """A message as quoted lines (``> ...``), so nothing in it can pass for an environment line."""
    return "\n".join(f"> {line}" for line in (message.splitlines() or ["(empty message)"]))


class NegotiationEnv(SocialEnv):
    """Rounds of dividing ``items`` (``quantity`` units each); see the module docstring for the rules."""

    stop = ("</message>", "</propose>")
    #: Whether each player sees the other's values during a round (no-press Split) or only afterwards.
    values_public: ClassVar[bool] = False

    def __init__(
        self,
        *,
        items: Sequence[str],
        quantity: int,
        messages: bool,
        num_rounds: int,
        max_retries: int,
        max_message_chars: int,
        render_mode: str | None,
    ) -> None:
        super().__init__(num_rounds=num_rounds, max_retries=max_retries, render_mode=render_mode)
        if isinstance(items, str) or not isinstance(items, Iterable):  # "abc" was three items a, b, c
            raise ValueError(f"items must be a list of distinct alphabetic names, got {items!r}")
        items = tuple(str(item) for item in items)
        if not items or len(set(items)) != len(items) or any(not item.isalpha() for item in items):
            raise ValueError(f"items must be distinct alphabetic names, got {items!r}")
        self.items = items
        self.quantity = checks.integer("quantity", quantity, minimum=1)
        self.messages = messages
        self.max_message_chars = checks.integer("max_message_chars", max_message_chars, minimum=1)

    # -- what a game adds ------------------------------------------------------------------------------
    def _sample_values(self) -> dict[str, Bundle]:
        """Per-unit values of each item for each player, for a new round (from ``self.rng``)."""
        raise NotImplementedError

    def _rules(self) -> str:
        raise NotImplementedError

    def _private_info(self, agent: str) -> str:
        """What ``agent`` learns about the new round's values (default: its own values)."""
        lines = [f"Your values per unit: {format_bundle(self.values[agent])}."]
        if self.values_public:
            lines.append(f"The other player's values per unit: {format_bundle(self.values[other(agent)])}.")
        else:
            lines.append("You don't know the other player's values.")
        return "\n".join(lines)

    def _summary_extra(self, agent: str) -> list[str]:
        return []

    # -- SocialEnv hooks --------------------------------------------------------------------------------
    def _start(self, options: dict[str, Any]) -> str:
        self.first_speaker = AGENTS[int(self.rng.integers(2))]
        self.stage = 0  # messages sent this round
        self.rounds: list[dict[str, Any]] = []  # per round: values, proposals, received, points
        self._cooperative = dict.fromkeys(AGENTS, 0)  # (round, item) cells where the agent did not over-claim
        self._welfare = [0.0, 0.0]  # both players' points so far, and the most they could have made
        self._new_round()
        return self._rules()

    def _speakers(self) -> tuple[str, str]:
        first = self.first_speaker if self.round % 2 == 1 else other(self.first_speaker)
        return first, other(first)

    def _new_round(self) -> None:
        self.values = self._sample_values()
        for agent in AGENTS:
            lines = [f"Round {self.round} of {self.num_rounds}. Items: {self._stock()}.", self._private_info(agent)]
            if self.messages:
                first = self._speakers()[0]
                lines.append("You speak first this round." if first == agent else "The other player speaks first this round.")
            self._tell(agent, "\n".join(lines))

    def _stock(self) -> str:
        return ", ".join(f"{self.quantity} {item}" for item in self.items)

    def _phase(self) -> tuple[str, tuple[str, ...]]:
        if self.messages and self.stage < 2:
            return "message", (self._speakers()[self.stage],)
        return "propose", AGENTS

    def _prompt(self, agent: str) -> str:
        if self._phase()[0] == "message":
            return (f"Round {self.round} of {self.num_rounds}: write your message to the other player inside "
                    f"<message></message> (at most {self.max_message_chars} characters).")
        if len(self.items) == 1:
            return (f"Round {self.round} of {self.num_rounds}: submit how many of the {self.quantity} "
                    f"{self.items[0]} you want to keep, as <propose>x</propose> with x from 0 to {self.quantity}.")
        example = ", ".join(f"{item}=x" for item in self.items)
        return (f"Round {self.round} of {self.num_rounds}: submit how many units of each item you want to keep, "
                f"as <propose>{example}</propose> with each x from 0 to {self.quantity}.")

    def _parse(self, agent: str, text: str) -> tuple[Any, str | None]:
        if self._phase()[0] == "message":
            content = extract_tag(text, "message", last=True)
            if content is None:
                return None, "no <message>...</message> found; put your message inside <message></message>."
            return content, None
        content = extract_tag(text, "propose", last=True)
        if content is None:
            return None, "no <propose>...</propose> found; put your proposal inside <propose></propose>."
        if len(content) > MAX_PROPOSAL_CHARS:
            return None, f"the proposal is {len(content)} characters long; write only the amounts."
        return parse_bundle(content, self.items, self.quantity)

    def _default(self, agent: str) -> tuple[Any, str]:
        if self._phase()[0] == "message":
            return "", "an empty message"
        return dict.fromkeys(self.items, 0), "a proposal to keep nothing"

    def _resolve(self, actions: dict[str, Any]) -> dict[str, float]:
        if self._phase()[0] == "message":
            (speaker, message), = actions.items()
            if len(message) > self.max_message_chars:
                message = message[: self.max_message_chars]
                self._tell(speaker, f"Your message was cut to {self.max_message_chars} characters.")
            self._tell(other(speaker), f"The other player says:\n{quote(message)}")
            self._transcript.append(f"[round {self.round}] {speaker} says:\n{quote(message)}")
            self.stage += 1
            return dict.fromkeys(AGENTS, 0.0)
        return self._split(actions)

    def _split(self, proposals: dict[str, dict[str, int]]) -> dict[str, float]:
        received: dict[str, Bundle] = {agent: {} for agent in AGENTS}
        for item in self.items:
            shares = allocate(proposals[AGENTS[0]][item], proposals[AGENTS[1]][item], self.quantity)
            for agent, share in zip(AGENTS, shares, strict=True):
                received[agent][item] = share
        scores = {agent: sum(received[agent][i] * self.values[agent][i] for i in self.items) for agent in AGENTS}
        self.rounds.append({"values": self.values, "proposals": proposals, "received": received, "points": scores})
        self._score_cooperation(proposals, scores)
        for agent in AGENTS:
            them = other(agent)
            lines = [
                f"Round {self.round} summary.",
                f"Values per unit: you {format_bundle(self.values[agent])}; "
                f"the other player {format_bundle(self.values[them])}.",
                f"Proposals: you {format_bundle(proposals[agent])}; the other player {format_bundle(proposals[them])}.",
                f"Received: you {format_bundle(received[agent])}; the other player {format_bundle(received[them])}.",
                *self._summary_extra(agent),
                f"Points: you {number(scores[agent])}, the other player {number(scores[them])}.",
            ]
            self._tell(agent, "\n".join(lines))
        self._transcript.append(f"[round {self.round}] proposals {proposals}, points {scores}")
        self.stage = 0
        self.round += 1
        if self.round <= self.num_rounds:
            self._new_round()
        return scores

    def _score_cooperation(self, proposals: dict[str, dict[str, int]], scores: dict[str, float]) -> None:
        for item in self.items:
            mine, theirs = (self.values[agent][item] for agent in AGENTS)
            for agent, value, other_value in ((AGENTS[0], mine, theirs), (AGENTS[1], theirs, mine)):
                self._cooperative[agent] += proposals[agent][item] <= welfare_share(value, other_value, self.quantity)
            self._welfare[1] += self.quantity * max(mine, theirs)
        self._welfare[0] += sum(scores.values())

    def _game_metrics(self, agent: str) -> dict[str, float]:
        """``cooperation_rate``: share of (round, item) where the agent asked for no more than the
        welfare-maximising share; ``welfare_efficiency``: both players' points over the most possible."""
        cells = len(self.rounds) * len(self.items)
        achieved, possible = self._welfare
        return {
            "cooperation_rate": self._cooperative[agent] / cells if cells else 0.0,
            "welfare_efficiency": achieved / possible if possible else 0.0,
        }
