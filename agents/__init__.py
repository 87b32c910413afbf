"""rl_llm.agents: policies (LLM backends and classical baselines), rollouts and evaluation."""

from __future__ import annotations

from rl_llm.agents.baselines import BASELINES, baselines_for, make_baseline
from rl_llm.agents.policy import Completion, Policy, TextPolicy


def make_policy(spec: str, env_id: str, seed: int | None = None) -> Policy:
    """Build an agent from a command-line spec: a baseline name for ``env_id`` (``ucb``, ``minimax``, ...)."""
    if ":" in spec:
        raise ValueError(f"LLM backends ({spec!r}) are not available in this build; use a baseline name")
    return make_baseline(spec, env_id, seed=seed)


__all__ = ["BASELINES", "Completion", "Policy", "TextPolicy", "baselines_for", "make_baseline", "make_policy"]
