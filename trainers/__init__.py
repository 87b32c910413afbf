"""rl_llm.trainers: trajectory-level PPO / GRPO for multi-turn LLM agents (docs/design.md#the-trainer-loop).

- ``grpo.train_grpo`` / ``ppo.train_ppo``: the training loops; ``cli.train_main`` behind ``rl-llm train``;
  ``default_job``: what ``rl-llm train`` runs without a config.
- ``config``: ``TrainConfig`` and ``load_config(path, overrides)`` (YAML + ``key=value``).
- ``advantages`` (GAE, GRPO, Dr. GRPO, RLOO, REINFORCE), ``losses`` (clipped surrogate, value loss, k3 KL,
  entropy, aggregation modes), ``rewards`` (OTC, PODS), ``batch`` (trajectories -> tensors).
- ``update`` (minibatch updates), ``modeling`` (log-probs, critic, LoRA), ``generation`` (which generator a
  run gets, with its weight sync), ``sync`` (weights to the generator), ``checkpoint``, ``logging``,
  ``evaluation``, ``runner`` (what a loop needs around it).
- ``adapters``: moved to ``rl_llm.integrations``; the old import paths still work (with a warning).

Submodules are imported on use, so ``import rl_llm.trainers`` stays light.
"""
