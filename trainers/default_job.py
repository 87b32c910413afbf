"""The embedded default training job: ``rl-llm train`` with no config.

The locally built tiny model (random weights, ~0.5M parameters, pinned recipe: ``rl_llm.agents.tiny``) learns
a 3-armed Bernoulli bandit with GRPO on CPU: from about -10 (almost every answer invalid) to the optimal 4.0
per episode when it finds the best arm, where the random and UCB baselines score about 1.9 and 2.1 on the
same held-out seeds. Whether it finds the best arm still depends on the training seed (2 of seeds 0..4;
``python benchmarks/default_job.py`` runs them and prints the figures; see below).

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
  model starts by emitting arbitrary tokens (about 1 in 170 is an arm label: 12 of the 2003 tokens) and there is no
  supervised warm-start.
- 64 episodes per step (8 tasks x 8), 20 steps, two minibatches (two optimizer steps per batch, so the clip
  range and clip-higher's 0.28 act; with one step the PPO ratio is 1 and they are inert). The arm is picked by
  chance while the model is still learning to write a valid label: a valid turn is worth +3, the best arm at
  most 1 more than the others, so whichever label gets frequent first tends to take over and the best arm
  may never be sampled again. More episodes per step make it likelier that groups hold valid answers of
  several labels while the format is learned, but do not remove the lottery: measured with
  ``benchmarks/default_job.py`` (tiny model recipe 1), seeds 0 and 3 reach the optimal 4.0, seed 1 ends at
  3.40 (best-arm share 0.74, still rising), seeds 2 and 4 settle on a worse arm (1.6-1.7, below UCB's 2.14);
  30 steps with one minibatch did not rescue seeds 2 and 4; 128 episodes per step (``rollout.prompts_per_step=16``)
  did: both found the best arm (seed 4: 4.00, share 1.00; seed 2: 3.41, share 0.75 and rising at step 20), at
  about 255 s of CPU time per run instead of ~120. Open: issue 15, item 1 (every seed, in 2 minutes).
- Held-out evaluation on seeds 100000.. (training uses 0..), sampling at temperature 1 (the trained
  policy itself), with the random and UCB baselines on the same seeds.
"""

from __future__ import annotations

from typing import Any

from rl_llm.trainers.config import TrainConfig

DEFAULT_JOB: dict[str, Any] = {
    "algorithm": "grpo",
    "steps": 20,
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
    "rollout": {"group_size": 8, "prompts_per_step": 8, "max_new_tokens": 1, "temperature": 1.0},
    "optim": {"lr": 5e-3, "micro_batch_size": 32, "max_grad_norm": 1.0, "minibatches": 2},
    # Two minibatches: the second optimizer step sees ratios away from 1, so clip-higher's 0.28 acts.
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
