"""rl_llm.envs: multi-turn text environments (Gymnasium API), wrappers and parsing helpers."""

from rl_llm.envs.base import Outcome, Task, TextEnv
from rl_llm.envs.registration import ENVIRONMENTS, env_ids, register_envs
from rl_llm.envs.spaces import UnicodeText

__all__ = ["ENVIRONMENTS", "Outcome", "Task", "TextEnv", "UnicodeText", "env_ids", "register_envs"]
