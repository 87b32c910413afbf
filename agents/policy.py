"""The agent interface: a ``Policy`` plays each episode through an ``EpisodeAgent`` it makes for that episode.

Every agent, LLM backends, classical baselines and a person at the terminal alike, goes through one episode
loop, the rollout engine (``rl_llm.agents.rollout``)::

    agent = policy.start_episode(EpisodeStart(env, info, seed=..., group_index=..., seat=...))
    action = agent.act(conversation)      # each turn: str, or a Completion (text, token ids, log-probs)
    agent.end(trajectory)                 # once, when the episode is over

The ``EpisodeAgent`` is the episode's own state: an oracle keeps its plan there, a random baseline its random
stream, so nothing pairs conversations with episodes by their order in a batch. Baselines emit the same
action text an LLM would, so every agent goes through the environment's real parser.

LLM policies (``rl_llm.agents.llm.LLMPolicy``) are driven by the engine through generation requests instead
(batched, token-in, token-out); their ``start_episode`` gives an agent for code outside the engine.
``Policy.act(conversations)`` stays as a stateless batch convenience (LLM backends, ``TextPolicy``).
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rl_llm.types import Message

if TYPE_CHECKING:
    from rl_llm.types import Trajectory

_MASK64 = (1 << 64) - 1


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


@dataclass(frozen=True)
class EpisodeStart:
    """What an agent is told when an episode starts: the env just reset, its reset info, and which episode.

    ``(seed, group_index, seat)`` names the episode (``key``): the env seed, the rollout's index in its GRPO
    group, and in a two-player game the player this agent plays (``"player_0"``; None in a single-agent env).
    """

    env: Any  # the gym.Env (single agent) or the PettingZoo env of a game, just after reset
    info: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    group_index: int = 0
    seat: str | None = None

    @property
    def key(self) -> tuple[int | None, int, str | None]:
        return (self.seed, self.group_index, self.seat)

    @property
    def stop(self) -> tuple[str, ...]:
        """The stop strings the env announces (closing tags of its actions)."""
        return tuple(self.info.get("stop", ()))

    def rng(self, parent: np.random.Generator) -> np.random.Generator:
        """A random stream for this episode, derived from ``parent``'s seed and the episode's key: the same
        for the same policy seed and episode, whatever ran before it or beside it. Unseeded episodes draw
        their stream from ``parent`` (reproducible in call order only)."""
        if self.seed is None:
            return np.random.default_rng(parent.integers(1 << 63))
        seed_seq = parent.bit_generator.seed_seq
        key = [self.seed & _MASK64, self.group_index & _MASK64]
        if self.seat is not None:
            key.append(zlib.crc32(self.seat.encode()))
        if not isinstance(seed_seq, np.random.SeedSequence):  # a generator built from a bare bit generator
            return np.random.default_rng([int(parent.integers(1 << 63)), *key])
        return np.random.default_rng(np.random.SeedSequence(seed_seq.entropy, spawn_key=(*seed_seq.spawn_key, *key)))


class EpisodeAgent:
    """One policy playing one episode (one seat of a game). The engine asks it for every turn of that episode.

    ``act`` returns the action text (or a ``Completion``); agents that wait on something outside the process
    (a person, a remote service) override ``aact`` instead, so the engine's other episodes go on meanwhile.
    """

    def act(self, conversation: Sequence[Message]) -> str | Completion:
        raise NotImplementedError

    async def aact(self, conversation: Sequence[Message]) -> str | Completion:
        """The engine calls this, on its event loop: keep ``act`` fast (baselines parse text) or override it."""
        return self.act(conversation)

    def end(self, trajectory: Trajectory) -> None:
        """Called once when the episode is over (not when it is paused), before its env plays another."""


class Policy:
    """Base class of all agents: ``start_episode`` makes the ``EpisodeAgent`` that plays one episode."""

    name = "policy"

    def start_episode(self, episode: EpisodeStart) -> EpisodeAgent:
        """Called after ``env.reset`` (by the rollout engine, a tournament, ``rl-llm play``); oracle agents read
        the env's ground truth from ``episode.env.unwrapped`` here.

        The default serves policies that implement only the batch ``act``: one conversation per call.
        """
        return _BatchAct(self)

    def act(self, conversations: Sequence[Sequence[Message]]) -> list[Completion]:
        """A stateless batch of conversations to answer (LLM backends, ``TextPolicy``); agents with episode
        state implement ``start_episode`` instead."""
        raise NotImplementedError(f"{type(self).__name__} plays through start_episode(...).act(conversation)")

    def close(self) -> None:
        """Release backend resources (servers, engines)."""


class _BatchAct(EpisodeAgent):
    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def act(self, conversation: Sequence[Message]) -> Completion:
        return self.policy.act([conversation])[0]


class TextPolicy(Policy):
    """A policy that answers from the conversation's text: ``respond(conversation) -> str`` (the baselines).

    Each episode plays a shallow copy of the policy (its ``EpisodeAgent``): ``begin(episode)`` sets up the copy,
    and an ``rng`` attribute (a ``numpy.random.Generator``) is replaced there by the episode's own stream
    (``EpisodeStart.rng``), so an episode's draws never depend on the episodes played before or beside it.
    """

    def start_episode(self, episode: EpisodeStart) -> EpisodeAgent:
        player = copy.copy(self)
        if isinstance(getattr(self, "rng", None), np.random.Generator):
            player.rng = episode.rng(self.rng)
        player.begin(episode)
        return _Responder(player)

    def begin(self, episode: EpisodeStart) -> None:
        """Per-episode setup, on the episode's copy (e.g. read the env's stop strings from ``episode.info``)."""

    def act(self, conversations: Sequence[Sequence[Message]]) -> list[Completion]:
        return [Completion(self.respond(list(conversation))) for conversation in conversations]

    def respond(self, conversation: list[Message]) -> str:
        raise NotImplementedError


class _Responder(EpisodeAgent):
    def __init__(self, player: TextPolicy) -> None:
        self.player = player

    def act(self, conversation: Sequence[Message]) -> str:
        return self.player.respond(list(conversation))


def as_completion(action: str | Completion) -> Completion:
    """An agent's answer as a ``Completion`` (text agents answer with a bare string)."""
    if isinstance(action, Completion):
        return action
    if not isinstance(action, str):
        raise TypeError(f"an agent answers with str or Completion, got {type(action).__name__}")
    return Completion(action)


def last_user_message(conversation: Sequence[Message]) -> str:
    for message in reversed(conversation):
        if message.role in ("user", "tool"):
            return message.content
    return ""


def system_message(conversation: Sequence[Message]) -> str:
    return conversation[0].content if conversation and conversation[0].role == "system" else ""
