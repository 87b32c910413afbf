"""rl_llm.envs.wrappers"""

from rl_llm.envs.wrappers.attempts import MultiAttempt, TryAgain
from rl_llm.envs.wrappers.otc import OptimalCallsTracker, OptimalToolCalls

__all__ = ["MultiAttempt", "OptimalCallsTracker", "OptimalToolCalls", "TryAgain"]
