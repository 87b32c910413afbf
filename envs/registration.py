"""Registration of every rl-llm environment under the ``rl-llm/`` namespace.

One line per environment: id, entry point and a one-line summary for ``rl-llm list``. Entry points are
strings, so registering imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym


@dataclass(frozen=True)
class EnvEntry:
    id: str
    entry_point: str
    summary: str
    kwargs: dict[str, Any] = field(default_factory=dict)


ENVIRONMENTS: tuple[EnvEntry, ...] = (
    EnvEntry(
        "rl-llm/MultiArmedBandit-v0",
        "rl_llm.envs.multi_armed_bandit:MultiArmedBanditEnv",
        "K-armed Bernoulli/Gaussian bandit; pick arms by label, regret metrics",
    ),
    EnvEntry(
        "rl-llm/ContextualBandit-v0",
        "rl_llm.envs.contextual_bandit:ContextualBanditEnv",
        "linear contextual bandit; context vector in text, per-step optimal arm",
    ),
    EnvEntry(
        "rl-llm/TicTacToe-v0",
        "rl_llm.envs.tic_tac_toe:TicTacToeEnv",
        "tic-tac-toe vs random / minimax / mixed opponent",
    ),
)


def register_envs() -> None:
    """Register every environment with Gymnasium (idempotent)."""
    for entry in ENVIRONMENTS:
        if entry.id not in gym.registry:
            gym.register(id=entry.id, entry_point=entry.entry_point, kwargs=dict(entry.kwargs))


def env_ids() -> list[str]:
    return [entry.id for entry in ENVIRONMENTS]
