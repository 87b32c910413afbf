"""rl_llm.envs: multi-turn text environments (Gymnasium API), wrappers, parsing helpers and the contract
checker ``check_text_env`` (docs/writing-an-environment.md)."""

from rl_llm.envs.base import Outcome, Task, TextEnv
from rl_llm.envs.checker import EnvContractError, check_episode, check_text_env
from rl_llm.envs.registration import ENVIRONMENTS, EnvFactory, env_ids, register_envs
from rl_llm.envs.spaces import UnicodeText

__all__ = [
    "ENVIRONMENTS",
    "EnvContractError",
    "EnvFactory",
    "Outcome",
    "Task",
    "TextEnv",
    "UnicodeText",
    "check_episode",
    "check_text_env",
    "env_ids",
    "register_envs",
]
