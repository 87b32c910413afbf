"""Classical baselines, by environment. ``make_baseline(name, env_id, seed)`` builds one.

Keys are Gymnasium ids for the single-agent environments and module names (``prisoners_dilemma_v0``) for
the PettingZoo social games.
"""

from __future__ import annotations

from collections.abc import Callable

from rl_llm.agents.baselines.bandits import (
    UCB1,
    EpsilonGreedy,
    LinUCBAgent,
    RandomArm,
    RandomContextualArm,
    ThompsonSampling,
)
from rl_llm.agents.baselines.math import MathOracle, RandomMath
from rl_llm.agents.baselines.random_agents import BanditOracle, RandomSearch, RandomSQL, RandomTool
from rl_llm.agents.baselines.search import SearchOracle, ToolCallsJsonOracle, ToolCallsOracle
from rl_llm.agents.baselines.social import SOCIAL_BASELINES
from rl_llm.agents.baselines.sql import OracleSQL, SchemaProbeSQL
from rl_llm.agents.baselines.terminal import DoNothing, RandomCommands, TerminalOracle
from rl_llm.agents.baselines.tictactoe import Minimax, RandomMove
from rl_llm.agents.policy import Policy
from rl_llm.checks import integer

# env id -> baseline name -> factory(seed)
BASELINES: dict[str, dict[str, Callable[..., Policy]]] = {
    "rl-llm/MultiArmedBandit-v0": {
        "random": RandomArm,
        "epsilon_greedy": EpsilonGreedy,
        "ucb": UCB1,
        "thompson": ThompsonSampling,
        "oracle": BanditOracle,
    },
    "rl-llm/ContextualBandit-v0": {"random": RandomContextualArm, "linucb": LinUCBAgent, "oracle": BanditOracle},
    "rl-llm/TicTacToe-v0": {"random": RandomMove, "minimax": Minimax},
    "rl-llm/TextToSQL-v0": {"oracle": OracleSQL, "schema-probe": SchemaProbeSQL, "random": RandomSQL},
    "rl-llm/Search-v0": {"oracle": SearchOracle, "random": RandomSearch},
    "rl-llm/ToolCalls-v0": {"oracle": ToolCallsOracle, "oracle_json": ToolCallsJsonOracle, "random": RandomTool},
    "rl-llm/Terminal-v0": {"oracle": TerminalOracle, "do_nothing": DoNothing, "random": RandomCommands},
    "rl-llm/Math-v0": {"oracle": MathOracle, "random": RandomMath},
    **SOCIAL_BASELINES,
}


def baselines_for(env_id: str) -> list[str]:
    return list(BASELINES.get(env_id, {}))


def make_baseline(name: str, env_id: str, seed: int | None = None) -> Policy:
    # numpy refuses a negative or float seed deep inside default_rng, and baselines without randomness
    # ignored it: one error here for all of them.
    seed = None if seed is None else integer("seed", seed)
    available = BASELINES.get(env_id)
    if not available:
        raise ValueError(f"no baselines are defined for {env_id}")
    if name not in available:
        raise ValueError(f"unknown baseline {name!r} for {env_id}; choose from {sorted(available)}")
    return available[name](seed=seed)


__all__ = ["BASELINES", "baselines_for", "make_baseline"]
