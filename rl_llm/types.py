"""The few records that cross layers: messages, turns and trajectories.

A trajectory is stored token-in, token-out: every token appears once, tagged with the role that produced it,
so a trainer can rebuild the exact context the generator saw and mask the loss to policy tokens.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import IntEnum
from typing import Any, Literal

TRAJECTORY_SCHEMA_VERSION = 3
# Versions ``from_json`` reads; fields added since version 1 take their defaults.
READABLE_SCHEMA_VERSIONS = (1, 2, 3)

Role = Literal["system", "user", "assistant", "tool"]


@dataclass
class Message:
    """One chat message, in the shape chat templates and OpenAI-style APIs expect."""

    role: Role
    content: str

    def to_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


class TokenRole(IntEnum):
    """Who produced a token. Only POLICY tokens carry loss, KL and entropy."""

    PROMPT = 0
    POLICY = 1
    ENV = 2


@dataclass
class Turn:
    """One agent turn: the action text, the env's reply and the reward that step returned.

    ``token_start``/``token_end`` index the policy tokens of this turn inside ``Trajectory.token_ids``.
    """

    action: str
    observation: str
    reward: float
    invalid_action: bool = False
    token_start: int = 0
    token_end: int = 0
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trajectory:
    """A whole episode of one agent in one environment."""

    env_id: str
    task_id: str
    seed: int | None
    messages: list[Message] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    token_roles: list[int] = field(default_factory=list)
    # Sampling log-probs of the generator, one per token; 0.0 for prompt/env tokens.
    logprobs: list[float] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    policy_version: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    # Added in schema version 2 (the rollout engine fills them).
    # Rollouts of the same seed (and reset options) form one GRPO group: same ``group_id``, ``group_index`` 0..G-1.
    group_id: str = ""
    group_index: int = 0
    # Temperature the log-probs were computed at (log_softmax(logits / temperature)).
    temperature: float = 1.0
    # "terminated", "truncated", "context_limit" or "error" (then ``error`` says what went wrong).
    end_reason: str = ""
    # Added in schema version 3: in a two-player game (docs/multi-agent.md), the player this trajectory is
    # ("player_0"), and who played the other seat ("self" in self-play, else its name); "" in a single-agent env.
    seat: str = ""
    opponent: str = ""

    @property
    def total_reward(self) -> float:
        return float(sum(turn.reward for turn in self.turns))

    @property
    def num_policy_tokens(self) -> int:
        return sum(1 for role in self.token_roles if role == TokenRole.POLICY)

    def to_json(self) -> str:
        record = asdict(self)
        record["schema_version"] = TRAJECTORY_SCHEMA_VERSION
        record["total_reward"] = self.total_reward
        return json.dumps(record, ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Trajectory:
        record = json.loads(line)
        version = record.pop("schema_version", None)
        if version not in READABLE_SCHEMA_VERSIONS:
            raise ValueError(
                f"unsupported trajectory schema version {version!r}; this rl-llm reads {READABLE_SCHEMA_VERSIONS}"
            )
        record.pop("total_reward", None)
        record["messages"] = [Message(**m) for m in record["messages"]]
        record["turns"] = [Turn(**t) for t in record["turns"]]
        return cls(**record)
