"""rl-llm: multi-turn text environments, agents and trainers for RL with LLM agents.

Importing the package registers every environment under the ``rl-llm/`` namespace::

    import gymnasium as gym
    import rl_llm  # noqa: F401

    env = gym.make("rl-llm/TicTacToe-v0")
"""

from rl_llm.envs.registration import register_envs

__version__ = "0.1.0"

register_envs()

__all__ = ["__version__", "register_envs"]
