"""rl_llm.trainers.adapters: rl-llm environments inside external trainers and behind a network API.

- ``generic``: ``EnvFactory`` (picklable) and ``MessageEnv`` (``reset(task) -> messages``,
  ``step(messages) -> (messages, reward, done, info)``) for OpenRLHF, SkyRL and hand-written loops.
- ``http_server`` / ``http_client``: a FastAPI env server with sessions, batching, timeouts and reaping.
- ``trl``: ``EnvRollout``, a ``rollout_func`` for TRL's ``GRPOTrainer``.
- ``verl``: ``RLLMAgentLoop``, a verl agent loop (``configs/verl/``).
- ``rl_llm.agents.ray_pool.RayEnvPool``: envs on Ray actors, usable wherever an env factory is.

Importing this package needs none of the optional extras (fastapi, ray, trl, verl).
"""

from rl_llm.trainers.adapters.generic import EnvFactory, MessageEnv

__all__ = ["EnvFactory", "MessageEnv"]
