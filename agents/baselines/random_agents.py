"""The baselines that anchor normalized benchmark scores: ``random`` where an env lacked one, ``oracle`` for
the bandits.

``rl-llm bench`` scores an agent as ``(score - random) / (oracle - random)``, so every environment needs a
``random`` agent (a uniformly random but well-formed action through the env's real parser) and, where the
env knows its answer, an ``oracle``. The ones defined here:

- ``BanditOracle`` (both bandits): pulls the arm with the highest expected reward at the current step,
  read from the env (the per-step optimal arm of the contextual bandit).
- ``RandomSQL`` (TextToSQL): ``SELECT * FROM`` a random table of the schema shown in the observation.
- ``RandomSearch`` (Search): one search for random words of the question, then a random word of the
  retrieved text (or of the question) as the answer.
- ``RandomTool`` (ToolCalls): one random tool call built from the question's words or numbers, then a
  random token of the tool's reply as the answer.

All of them answer in the tags the env announces in ``info["stop"]`` (``</search>`` -> ``<search>``), so
they follow whichever protocol the env was built with.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from rl_llm.agents.policy import EpisodeAgent, EpisodeStart, Policy, TextPolicy, last_user_message
from rl_llm.types import Message

_TABLE = re.compile(r"CREATE TABLE\s+[\"`\[]?(\w+)", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]{2,}|\d+(?:\.\d+)?")
_STOPWORDS = frozenset((
    "the", "and", "was", "what", "which", "who", "whom", "whose", "where", "when", "how", "many", "much", "that",
    "this", "for", "with", "from", "are", "did", "does", "its", "into", "than", "then", "there", "their", "question",
))  # fmt: skip


class BanditOracle(Policy):
    """Pulls an arm with the highest expected reward now (MultiArmedBandit and ContextualBandit), read from
    the episode's env each turn."""

    name = "oracle"

    def __init__(self, seed: int | None = None) -> None:
        pass

    def start_episode(self, episode: EpisodeStart) -> EpisodeAgent:
        return _BestArm(episode.env.unwrapped)


class _BestArm(EpisodeAgent):
    def __init__(self, env: Any) -> None:
        self.env = env

    def act(self, conversation: Sequence[Message]) -> str:
        means = self.env._arm_means()
        return f"<action>{self.env.labels[int(np.argmax(means))]}</action>"


def open_tag(stop: str) -> str:
    """``</search>`` -> ``<search>``."""
    return "<" + stop[2:] if stop.startswith("</") else stop


class _RandomTagged(TextPolicy):
    """Random agents that act in the tags the env's stop strings name (one protocol per env instance)."""

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)
        self.stops: tuple[str, ...] = ()

    def begin(self, episode: EpisodeStart) -> None:
        self.stops = episode.stop

    def tag(self, name: str, default: str) -> tuple[str, str]:
        """The (open, close) pair whose closing tag mentions ``name``."""
        close = next((stop for stop in self.stops if name in stop), default)
        return open_tag(close), close

    def choice(self, items: Sequence[str], fallback: str = "unknown") -> str:
        return str(items[int(self.rng.integers(len(items)))]) if items else fallback


def words(text: str) -> list[str]:
    return [word for word in _WORD.findall(text) if word.lower() not in _STOPWORDS]


class RandomSQL(TextPolicy):
    """``SELECT * FROM`` a random table of the schema in the first observation, as the solution."""

    name = "random"

    def __init__(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    def respond(self, conversation: list[Message]) -> str:
        first = next((m.content for m in conversation if m.role == "user"), "")
        tables = _TABLE.findall(first) or ["sqlite_master"]
        table = tables[int(self.rng.integers(len(tables)))]
        return f"<think>I pick a table at random.</think>\n<solution>SELECT * FROM {table}</solution>"


class RandomSearch(_RandomTagged):
    """A search for two random words of the question, then a random word of what came back as the answer."""

    name = "random"

    def respond(self, conversation: list[Message]) -> str:
        question = next((m.content for m in conversation if m.role == "user"), "")
        if sum(m.role == "assistant" for m in conversation) == 0:
            s_open, s_close = self.tag("search", "</search>")
            query = " ".join(self.choice(words(question)) for _ in range(2))
            return f"<think> I search at random. </think>\n{s_open} {query} {s_close}"
        a_open, a_close = self.tag("answer", "</answer>")
        guess = self.choice(words(last_user_message(conversation)) or words(question))
        return f"<think> I guess. </think>\n{a_open} {guess} {a_close}"


class RandomTool(_RandomTagged):
    """One random tool call (search words of the question, or arithmetic or Python on its numbers), then
    a random token of the tool's reply as the answer."""

    name = "random"

    def respond(self, conversation: list[Message]) -> str:
        question = next((m.content for m in conversation if m.role == "user"), "")
        if sum(m.role == "assistant" for m in conversation) == 0:
            numbers = re.findall(r"\d+", question) or ["1", "2"]
            offered = [tool for tool in ("search", "calculator", "python") if f"</{tool}>" in self.stops]
            tool = self.choice(offered or ["search", "calculator", "python"])
            if tool == "search":
                argument = " ".join(self.choice(words(question)) for _ in range(2))
            elif tool == "calculator":
                argument = f"{self.choice(numbers)} {self.choice(['+', '-', '*'])} {self.choice(numbers)}"
            else:
                argument = f"print({self.choice(numbers)})"
            t_open, t_close = self.tag(tool, f"</{tool}>")
            return f"{t_open}{argument}{t_close}"
        a_open, a_close = self.tag("answer", "</answer>")
        return f"{a_open}{self.choice(words(last_user_message(conversation)) or words(question))}{a_close}"


__all__ = ["BanditOracle", "RandomSQL", "RandomSearch", "RandomTool"]
