"""Baselines for the two-player text games of ``rl_llm.envs.social``.

Like an LLM, they read the observation text of their conversation and answer with action text
(``<A>``, ``<message>...</message>``, ``<propose>...</propose>``, ``<move>...</move>``), so every move goes
through the game's real parser. They answer ``""`` when the last prompt asks nothing of them.

``SOCIAL_BASELINES[game][name](seed=...)`` builds one; ``rl_llm.agents.baselines.BASELINES`` includes them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rl_llm.agents.baselines.tictactoe import Minimax, RandomMove
from rl_llm.agents.policy import Policy, TextPolicy, last_user_message
from rl_llm.envs.social.negotiation import format_bundle, welfare_share
from rl_llm.envs.social.trust_and_split_v0 import BEATS, HANDS
from rl_llm.types import Message

# ----------------------------------------------------------------------------------------------------------
# Reading the observation text
# ----------------------------------------------------------------------------------------------------------
_MATRIX_RESULT = re.compile(r"^Round \d+ result: you played ([AB]), the other player played ([AB])\.", re.MULTILINE)
_ROUND_START = re.compile(r"^Round \d+ of \d+\. Items: ", re.MULTILINE)
_VALUE_RANGE = re.compile(r"a whole number from (\d+) to (\d+)\.")


def observation_text(conversation: list[Message]) -> str:
    """Every observation of the conversation, in order (the env's user messages)."""
    return "\n\n".join(message.content for message in conversation if message.role == "user")


def prompt_line(conversation: list[Message]) -> str:
    """The last line of the last observation: what the game asks for now."""
    lines = last_user_message(conversation).rstrip().splitlines()
    return lines[-1] if lines else ""


def read_bundle(text: str) -> dict[str, float]:
    """``"hats=10, books=1."`` -> ``{"hats": 10.0, "books": 1.0}`` (the format the games write)."""
    bundle = {}
    for part in text.strip().rstrip(".").split(","):
        name, _, amount = part.partition("=")
        bundle[name.strip()] = float(amount)
    return bundle


def last_line_after(text: str, prefix: str) -> str | None:
    """The rest of the last line of ``text`` that starts with ``prefix``."""
    start = text.rfind("\n" + prefix)
    if start < 0:
        if not text.startswith(prefix):
            return None
        start = -1
    end = text.find("\n", start + 1)
    return text[start + 1 + len(prefix) : end if end >= 0 else len(text)]


def you_and_them(line: str) -> tuple[dict[str, float], dict[str, float]]:
    """``"you hats=1, books=2; the other player hats=3, books=4."`` -> two bundles."""
    mine, _, theirs = line.removeprefix("you ").partition("; the other player ")
    return read_bundle(mine), read_bundle(theirs)


# ----------------------------------------------------------------------------------------------------------
# Matrix games: prisoner's dilemma, stag hunt, chicken (A = cooperate)
# ----------------------------------------------------------------------------------------------------------
class MatrixBaseline(TextPolicy):
    """Chooses A or B from the history of (own move, other's move) read from the round results."""

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    def respond(self, conversation: list[Message]) -> str:
        if "<A>" not in prompt_line(conversation):
            return ""
        history = _MATRIX_RESULT.findall(observation_text(conversation))
        return f"<{self.choose(history)}>"

    def choose(self, history: list[tuple[str, str]]) -> str:
        raise NotImplementedError


class AlwaysCooperate(MatrixBaseline):
    name = "always_cooperate"

    def choose(self, history: list[tuple[str, str]]) -> str:
        return "A"


class AlwaysDefect(MatrixBaseline):
    name = "always_defect"

    def choose(self, history: list[tuple[str, str]]) -> str:
        return "B"


class TitForTat(MatrixBaseline):
    """Cooperates first, then copies the other player's previous move."""

    name = "tit_for_tat"

    def choose(self, history: list[tuple[str, str]]) -> str:
        return history[-1][1] if history else "A"


class GrimTrigger(MatrixBaseline):
    """Cooperates until the other player defects once, then defects forever."""

    name = "grim_trigger"

    def choose(self, history: list[tuple[str, str]]) -> str:
        return "B" if any(theirs == "B" for _, theirs in history) else "A"


class WinStayLoseShift(MatrixBaseline):
    """Pavlov: keeps its move after a good round (the other cooperated), switches after a bad one;
    equivalently, cooperates exactly when both players made the same move last round."""

    name = "win_stay_lose_shift"

    def choose(self, history: list[tuple[str, str]]) -> str:
        if not history:
            return "A"
        mine, theirs = history[-1]
        return "A" if mine == theirs else "B"


class RandomMatrix(MatrixBaseline):
    name = "random"

    def choose(self, history: list[tuple[str, str]]) -> str:
        return "A" if self.rng.random() < 0.5 else "B"


# ----------------------------------------------------------------------------------------------------------
# Split games: split_v0 (values public) and trust_and_split_v0 (values private, one message each)
# ----------------------------------------------------------------------------------------------------------
@dataclass
class RoundView:
    """What a baseline knows in the current round of a split game."""

    items: tuple[str, ...]
    quantity: int
    mine: dict[str, float] | None = None  # own per-unit values (rps: known once the other's hand is)
    theirs: dict[str, float] | None = None  # the other's values: public (Split) or claimed in its message (TAS)
    hand: str | None = None  # rps: own hand
    their_hand: str | None = None  # rps: the hand the other player claims
    message: str | None = None  # the other player's message this round, without the "> " quotes
    previous: tuple[dict, ...] | None = None  # last round: my values, theirs, my proposal, theirs
    top_value: int = 20  # classic TAS: the top of the value range, from the rules


def _claimed_hand(message: str) -> str | None:
    """The one hand named in a message, if exactly one is."""
    named = [hand for hand in HANDS if hand in message.lower()]
    return named[0] if len(named) == 1 else None


def _claimed_values(message: str, items: tuple[str, ...]) -> dict[str, float] | None:
    """Values stated as ``values per unit: hats=3, books=7`` in a message, if complete."""
    start = message.find("values per unit:")
    if start < 0:
        return None
    try:
        claimed = read_bundle(message[start + len("values per unit:") :].split("\n", 1)[0])
    except ValueError:
        return None
    return claimed if set(claimed) == set(items) else None


def read_round(conversation: list[Message]) -> RoundView:
    """Parse the current round of a split game from the conversation's observations."""
    text = observation_text(conversation)
    starts = list(_ROUND_START.finditer(text))
    if not starts:
        raise ValueError("not a split-game observation: no 'Round r of n. Items:' line")
    current, past = text[starts[-1].start() :], text[: starts[-1].start()]
    stock = current[len(starts[-1].group(0)) :].split("\n", 1)[0].rstrip(".")
    counts = [part.strip().split(" ", 1) for part in stock.split(",")]
    view = RoundView(items=tuple(name for _, name in counts), quantity=int(counts[0][0]))
    if (values := last_line_after(current, "Your values per unit: ")) is not None:
        view.mine = read_bundle(values)
    if (values := last_line_after(current, "The other player's values per unit: ")) is not None:
        view.theirs = read_bundle(values)
    if (said := current.rfind("The other player says:\n")) >= 0:
        quoted = current[said:].split("\n")[1:]
        view.message = "\n".join(line[2:] for line in quoted if line.startswith("> "))
    if (hand := last_line_after(current, "Your hand: ")) is not None:
        view.hand = hand.split(".", 1)[0]
        view.their_hand = None if view.message is None else _claimed_hand(view.message)
        if view.their_hand not in (None, view.hand):  # relative values: only who wins matters
            wins = BEATS[view.hand] == view.their_hand
            view.mine, view.theirs = {view.items[0]: float(wins)}, {view.items[0]: float(not wins)}
    elif view.theirs is None and view.message is not None:
        view.theirs = _claimed_values(view.message, view.items)
    values, proposals = last_line_after(past, "Values per unit: "), last_line_after(past, "Proposals: ")
    if values is not None and proposals is not None:
        view.previous = (*you_and_them(values), *you_and_them(proposals))
    if (bounds := _VALUE_RANGE.search(text[: starts[0].start()])) is not None:
        view.top_value = int(bounds.group(2))
    return view


def over_claimed(view: RoundView) -> bool:
    """Whether the other player asked for more than its welfare-maximising share last round."""
    if view.previous is None:
        return False
    mine, theirs, _, their_proposal = view.previous
    return any(their_proposal[item] > welfare_share(theirs[item], mine[item], view.quantity) for item in view.items)


class SplitBaseline(TextPolicy):
    """Answers the message and proposal prompts of the split games from a ``RoundView``."""

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    def respond(self, conversation: list[Message]) -> str:
        prompt = prompt_line(conversation)
        if "<message>" in prompt:
            return f"<message>{self.message(read_round(conversation))}</message>"
        if "<propose>" in prompt:
            view = read_round(conversation)
            return f"<propose>{format_bundle(self.propose(view))}</propose>"
        return ""

    def message(self, view: RoundView) -> str:
        return truthful_message(view)

    def propose(self, view: RoundView) -> dict[str, int]:
        raise NotImplementedError


def truthful_message(view: RoundView) -> str:
    if view.hand is not None:
        return f"My hand: {view.hand}."
    return f"My values per unit: {format_bundle(view.mine or {})}."


def everything(view: RoundView) -> dict[str, int]:
    return dict.fromkeys(view.items, view.quantity)


def welfare_proposal(view: RoundView) -> dict[str, int]:
    """Each item to whoever values it more (by known or claimed values); half of it on a tie or if unknown."""
    if view.mine is None or view.theirs is None:
        return dict.fromkeys(view.items, view.quantity // 2)
    return {item: int(welfare_share(view.mine[item], view.theirs[item], view.quantity)) for item in view.items}


class Greedy(SplitBaseline):
    """Always proposes to keep everything (the best reply to any proposal under the proportional rule)."""

    name = "greedy"

    def message(self, view: RoundView) -> str:
        return "I want to keep everything."

    def propose(self, view: RoundView) -> dict[str, int]:
        return everything(view)


class WelfareMaximizer(SplitBaseline):
    """Cooperative: tells the truth and gives each item to whoever values it more (halves on ties)."""

    name = "welfare_maximizer"

    def propose(self, view: RoundView) -> dict[str, int]:
        return welfare_proposal(view)


class ReciprocalSplit(SplitBaseline):
    """Tit-for-tat for split games: cooperates like ``welfare_maximizer``, but keeps everything for a round
    after the other player asked for more than its welfare-maximising share."""

    name = "tit_for_tat"

    def message(self, view: RoundView) -> str:
        if over_claimed(view):
            return "You took more than your fair share last round, so I keep everything this round."
        return truthful_message(view)

    def propose(self, view: RoundView) -> dict[str, int]:
        return everything(view) if over_claimed(view) else welfare_proposal(view)


class Liar(SplitBaseline):
    """Exploiter for Trust-and-Split: claims the winning hand (the one beating the other's claim) or the top
    value for every item, then keeps everything."""

    name = "liar"

    def message(self, view: RoundView) -> str:
        if view.hand is not None:
            winning = next((hand for hand, beaten in BEATS.items() if beaten == view.their_hand), view.hand)
            return f"My hand: {winning}."
        return f"My values per unit: {format_bundle(dict.fromkeys(view.items, view.top_value))}."

    def propose(self, view: RoundView) -> dict[str, int]:
        return everything(view)


class RandomSplit(SplitBaseline):
    name = "random"

    def message(self, view: RoundView) -> str:
        return "Hello."

    def propose(self, view: RoundView) -> dict[str, int]:
        return {item: int(self.rng.integers(view.quantity + 1)) for item in view.items}


# ----------------------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------------------
_MATRIX = {cls.name: cls for cls in (AlwaysCooperate, AlwaysDefect, TitForTat, GrimTrigger, WinStayLoseShift,
                                     RandomMatrix)}

# game -> baseline name -> factory(seed=...)
SOCIAL_BASELINES: dict[str, dict[str, Callable[..., Policy]]] = {
    "prisoners_dilemma_v0": dict(_MATRIX),
    "stag_hunt_v0": dict(_MATRIX),
    "chicken_v0": dict(_MATRIX),
    "split_v0": {cls.name: cls for cls in (Greedy, WelfareMaximizer, ReciprocalSplit, RandomSplit)},
    "trust_and_split_v0": {cls.name: cls for cls in (Greedy, WelfareMaximizer, ReciprocalSplit, Liar, RandomSplit)},
    "tictactoe_v0": {"random": RandomMove, "minimax": Minimax},
}


__all__ = ["SOCIAL_BASELINES"]
