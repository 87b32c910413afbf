"""rl_llm.envs.wrappers: action templates, OTC reward, try-again / multi-attempt protocols, trajectory recording."""

from rl_llm.envs.wrappers.action_template import ActionTemplate
from rl_llm.envs.wrappers.attempts import MultiAttempt, TryAgain
from rl_llm.envs.wrappers.otc import OptimalCallsTracker, OptimalToolCalls
from rl_llm.envs.wrappers.record import RecordTrajectories

__all__ = ["ActionTemplate", "MultiAttempt", "OptimalCallsTracker", "OptimalToolCalls", "RecordTrajectories", "TryAgain"]
