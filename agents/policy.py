"""The ``Policy`` interface every agent implements, LLM backends and classical baselines alike.

A policy maps a batch of conversations to a batch of completions. Baselines emit the same action text an
LLM would, so every agent goes through the environment's real parser.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from rl_llm.types import Message


@dataclass
class Completion:
    """One generated turn. Token ids and log-probs are filled by backends that have them."""

    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None
    # The weights version that generated it, where the backend knows (asynchronous training, where weights
    # can change between the request and the moment the episode reads the reply).
    policy_version: int | None = None


class Policy:
    """Base class of all agents."""

    name = "policy"

    def start_episode(self, slot: int, env: gym.Env, info: dict[str, Any]) -> None:
        """Called after ``env.reset`` for the conversation at index ``slot`` of later ``act`` batches.

        Text-only agents ignore it; oracle agents read the env's ground truth here.
        """

    def act(self, conversations: Sequence[Sequence[Message]]) -> list[Completion]:
        raise NotImplementedError

    def close(self) -> None:
        """Release backend resources (servers, engines)."""


class TextPolicy(Policy):
    """A policy that answers each conversation independently from its text (the baselines)."""

    def act(self, conversations: Sequence[Sequence[Message]]) -> list[Completion]:
        return [Completion(self.respond(list(conversation))) for conversation in conversations]

    def respond(self, conversation: list[Message]) -> str:
        raise NotImplementedError


def last_user_message(conversation: Sequence[Message]) -> str:
    for message in reversed(conversation):
        if message.role in ("user", "tool"):
            return message.content
    return ""


def system_message(conversation: Sequence[Message]) -> str:
    return conversation[0].content if conversation and conversation[0].role == "system" else ""
