"""rl_llm.integrations: rl-llm environments inside external trainers and behind a network API.

It sits beside ``rl_llm.trainers``, not in it: these modules import envs and agents only (docs/design.md#integrations).

- ``generic``: ``EnvFactory`` (picklable) and ``MessageEnv`` (``reset(task) -> messages``,
  ``step(messages) -> (messages, reward, done, info)``) for OpenRLHF, SkyRL and hand-written loops.
- ``http_server`` / ``http_client``: a FastAPI env server with sessions, batching, timeouts and reaping.
- ``trl``: ``EnvRollout``, a ``rollout_func`` for TRL's ``GRPOTrainer``.
- ``verl``: ``RLLMAgentLoop``, a verl agent loop (``configs/verl/``).
- ``rl_llm.agents.ray_pool.RayEnvPool``: envs on Ray actors, usable wherever an env factory is.
- ``openenv``: any env served by openenv-core's ``create_app`` (``python -m rl_llm.integrations.openenv``).
- ``trl_env``: ToolCalls / Search / TextToSQL / Terminal as TRL ``environment_factory`` classes (tools = methods).
- ``skyrl``: every env as a skyrl-gym ``BaseTextEnv`` (``register_skyrl_envs``).
- ``verifiers_env``: ``load_environment(env_id, **kwargs)``, a verifiers 0.2 ``MultiTurnEnv`` (the classic API).
- ``verifiers_v1``: ``RLLMTaskset`` and ``RLLMEnv`` for the current verifiers API (``verifiers.v1``, 0.4).
- ``verifiers_hub``: an Environments Hub package per env, for either verifiers (``python -m ...verifiers_hub``).
- ``social_seat``: one seat of a social game as a single-agent env (``social/<game>`` ids in the adapters).

Importing this package needs none of the optional extras (fastapi, ray, trl, verl, openenv-core, skyrl-gym,
verifiers).
"""

from rl_llm.integrations.generic import EnvFactory, MessageEnv

__all__ = ["EnvFactory", "MessageEnv"]
