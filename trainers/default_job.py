"""The embedded default training job: ``rl-llm train`` with no config.

The locally built tiny model (random weights, ~0.5M parameters) learns a 3-armed Bernoulli bandit with GRPO
on CPU in a few minutes: from about -10 (almost every answer invalid) to the optimal 4.0 per episode, where
the random and UCB baselines score about 1.9 and 2.1 on the same held-out seeds.

Setting, and why:
- The bandit instance is fixed (arm means 0.2 / 0.9 / 0.5, ``means=...``) and the reward is the
  *strategic* reward of the research protocols (``(mu_a - mu_min) / (mu* - mu_min)`` per pull): a
  noise-free signal, so learning shows within a few dozen steps. An invalid turn costs 3 (the env then
  pulls a random arm, whose reward is noise to the learner; a penalty well above that noise keeps GRPO
  from reinforcing lucky invalid tokens; with a penalty of 1 learning sometimes stalled for 25+ steps).
  Because the instance is the same in every episode, the policy learns it *across* episodes, in its weights; random
  and UCB start every episode knowing nothing (UCB spends 3 of its 4 pulls trying each arm), so they are
  the scale, not the opponents. Learning to explore *within* an episode (``means`` drawn per seed) is the
  harder task of the research protocols and needs a real model and many more steps.
- ``env.action_template = "<action>{}</action>"`` with one generated token per turn: the generator writes
  only the content of the action tag and the trainer wraps it before the env parses it. A randomly
  initialised model would essentially never produce ``<action>B</action>`` (7 tokens) by chance, so
  without this there is no reward signal at all. Everything else is learned by RL from scratch: the
  model starts by emitting arbitrary tokens (about 1 in 160 is an arm label: 12 of the 1932 tokens) and there is no
  supervised warm-start.
- Held-out evaluation on seeds 100000.. (training uses 0..), sampling at temperature 1 (the trained
  policy itself), with the random and UCB baselines on the same seeds.
"""

from __future__ import annotations

from typing import Any

from rl_llm.trainers.config import TrainConfig

DEFAULT_JOB: dict[str, Any] = {
    "algorithm": "grpo",
    "steps": 40,
    "seed": 0,
    "env": {
        "id": "rl-llm/MultiArmedBandit-v0",
        "kwargs": {
            "num_arms": 3, "horizon": 4, "means": [0.2, 0.9, 0.5], "reward_mode": "strategic",
            "invalid_action_penalty": 3.0,
        },
        "action_template": "<action>{}</action>",
    },
    "model": {"path": "tiny"},
    "rollout": {"group_size": 8, "prompts_per_step": 4, "max_new_tokens": 1, "temperature": 1.0},
    "optim": {"lr": 5e-3, "micro_batch_size": 32, "max_grad_norm": 1.0},
    "loss": {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.0, "aggregation": "seq_mean_token_mean"},
    "eval": {"episodes": 64, "seed": 100_000, "baselines": ["random", "ucb"]},
    "log": {"checkpoint_every": 10},
}


def describe_default_job(config: TrainConfig) -> str:
    kwargs = ", ".join(f"{k}={v}" for k, v in config.env.kwargs.items())
    return (
        f"Default job: {config.algorithm} on {config.env.id} ({kwargs}) with the tiny local model, "
        f"{config.steps} steps of {config.rollout.prompts_per_step}x{config.rollout.group_size} episodes. "
        f"The model writes the tag content only (action template {config.env.action_template!r})."
    )
