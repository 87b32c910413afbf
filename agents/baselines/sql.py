"""Text2SQL reference agents: they read the gold SQL from the environment (upper bounds, and checks that the
environment's grading accepts a correct answer through the real parser and database)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym

from rl_llm.agents.policy import TextPolicy
from rl_llm.types import Message

PROBE_QUERY = "SELECT name FROM sqlite_master WHERE type = 'table'"


class OracleSQL(TextPolicy):
    """Submits the task's gold query as ``<solution>`` in its first turn."""

    name = "oracle"

    def __init__(self, seed: int | None = None) -> None:
        # Episodes are told apart by their first observation (the question and schema), which is what the
        # policy sees in each conversation; slots are not passed to ``act``.
        self._gold: dict[str, str] = {}
        self._multi_turn: dict[str, bool] = {}

    def start_episode(self, slot: int, env: gym.Env, info: dict[str, Any]) -> None:
        unwrapped = env.unwrapped
        task = getattr(unwrapped, "current_task", None)
        if task is None:
            kind = type(unwrapped).__name__
            raise ValueError(f"{self.name} needs a TextToSQL environment after reset, got {kind}")
        self._gold[unwrapped.first_observation] = task.gold_sql
        self._multi_turn[unwrapped.first_observation] = unwrapped.mode == "multi"

    def _episode_key(self, conversation: Sequence[Message]) -> str:
        question = next((m.content for m in conversation if m.role == "user"), None)
        if question is None or question not in self._gold:
            raise ValueError(f"{self.name}: unknown episode; call start_episode after each reset")
        return question

    def respond(self, conversation: Sequence[Message]) -> str:
        gold = self._gold[self._episode_key(conversation)]
        return f"<think>The question asks for exactly this query.</think>\n<solution>{gold}</solution>"


class SchemaProbeSQL(OracleSQL):
    """Runs one exploratory query (the table list) in multi-turn mode, then submits the gold query."""

    name = "schema-probe"

    def respond(self, conversation: Sequence[Message]) -> str:
        key = self._episode_key(conversation)
        explored = any(m.role == "assistant" and "<sql>" in m.content for m in conversation)
        if self._multi_turn[key] and not explored:
            return f"<think>First I list the tables.</think>\n<sql>{PROBE_QUERY}</sql>"
        return super().respond(conversation)
