"""The embedded default training job: ``rl-llm train`` with no config.

The locally built tiny model (random weights, ~0.65M parameters, pinned recipe: ``rl_llm.agents.tiny``) learns
a 3-armed Bernoulli bandit on CPU: a short supervised warm start teaches it to write a valid arm label (any
label), then GRPO finds the best arm and reaches about the optimal 4.0 per episode, where the random and UCB
baselines score about 1.9 and 2.1 on the same held-out seeds. ``python benchmarks/default_job.py`` runs it
for training seeds 0..4 and prints the figures (the README quotes them).

Setting, and why:
- The bandit instance is fixed (arm means 0.2 / 0.9 / 0.5, ``means=...``) and the reward is the
  *strategic* reward of docs/research-protocols.md#bandits (``(mu_a - mu_min) / (mu* - mu_min)`` per pull): a
  noise-free signal, so learning shows within a few steps. An invalid turn costs 3 (the env then pulls a
  random arm, whose reward is noise to the learner). Because the instance is the same in every episode, the
  policy learns it *across* episodes, in its weights; random and UCB start every episode knowing nothing
  (UCB spends 3 of its 4 pulls trying each arm), so they are the scale, not the opponents. Learning to
  explore *within* an episode (``means`` drawn per seed) is the harder task of those protocols and
  needs a real model and many more steps.
- ``env.action_template = "<action>{}</action>"`` with one generated token per turn: the generator writes
  only the content of the action tag and the trainer wraps it before the env parses it. A randomly
  initialised model would essentially never produce ``<action>B</action>`` (7 tokens) by chance.
- Warm start (``sft``, ``trainers/sft.py``): 2 epochs over 256 episodes played by the env's *random*
  baseline (seeds 1,000,000..). It teaches the format only: the random baseline picks every arm equally
  often, so the warm-started model writes a valid label almost always and spreads its choices over the
  three arms (held-out NLL per label token about log 3) — it is told nothing about which arm is best;
  that is left to RL. Why: trained from scratch by RL alone, the model learned the format and the arm at the
  same time, and which arm it settled on was a lottery over the training seed (issue 15). Early on only
  about 1 token in 170 is a label, so a step's batch holds one or two valid turns; GRPO's std-normalised
  advantage gives a lone valid turn about the same large advantage whatever its arm, and Adam turns it
  into a step of about ``lr`` on that label, so the label sampled first took over and the best arm was
  never sampled again (entropy -> 0). Measured with ``benchmarks/default_job.py`` before the warm start
  (RL only, 64 episodes per step, 20 steps): best arm found for seeds 0 and 3 only; seeds 2 and 4 settled
  on a worse arm with every variant tried on them: 128 episodes per step with ``history=full`` and 16
  steps (1.64 and 1.67, ~205 CPU s), horizon 2 with 128 episodes per step, horizon 2 with
  ``invalid_action_penalty`` 1 (settled on arm C); a penalty of 0.5 left the format unlearned after 17
  steps. With the warm start every group holds all three arms from step 1, the advantage ranks them by
  their reward, and the best arm wins within ~5 steps whatever the seed: measured with
  ``benchmarks/default_job.py`` (tiny model recipe 1, one torch thread, a 2-core CPU at load 2.9-4.9), every
  training seed 0..4 beat UCB: 4.000 (best-arm share 1.000), against UCB 2.192 and random 2.025, in 47-50 s
  of CPU time per run (warm start included; wall 50-140 s on that shared machine). The warm start is the generic
  ``sft`` stage of the trainer (the TicTacToe config uses it with minimax); nothing here is specific to
  the bandit beyond choosing the baseline that carries no answer.
- 8 GRPO steps of 64 episodes (8 tasks x 8), two minibatches (two optimizer steps per batch, so the clip
  range and clip-higher's 0.28 act; with one step the PPO ratio is 1 and they are inert).
- Held-out evaluation on seeds 100000.. (training uses 0.., the warm start 1,000,000..), sampling at
  temperature 1 (the trained policy itself), with the random and UCB baselines on the same seeds. The
  trainer's "before" evaluation is the warm-started model's; the untrained model's (about -10: almost every
  turn invalid) is in ``warm_start.json``.
"""


from __future__ import annotations

from typing import Any

from rl_llm.trainers.config import TrainConfig

DEFAULT_JOB: dict[str, Any] = {
    "algorithm": "grpo",
    "steps": 8,
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
    # Warm start on the random baseline's episodes: the format (a valid label) without any arm preference.
    "sft": {"episodes": 256, "epochs": 2, "lr": 5e-3, "batch_size": 32, "baseline": "random", "held_out_episodes": 16},
    "eval": {"episodes": 64, "seed": 100_000, "baselines": ["random", "ucb"]},
    "log": {"checkpoint_every": 10},
}


def describe_default_job(config: TrainConfig) -> str:
    kwargs = ", ".join(f"{k}={v}" for k, v in config.env.kwargs.items())
    return (
        f"Default job: {config.algorithm} on {config.env.id} ({kwargs}) with "
        + ("the tiny local model, " if str(config.model.path) == "tiny" else f"the model at {config.model.path}, ")
        + (f"warm-started on the episodes of {config.sft.data}, then " if config.sft.data else
           f"warm-started on {config.sft.episodes} episodes of the {config.sft.baseline} baseline, then "
           if config.sft.episodes else "")
        + f"{config.steps} steps of {config.rollout.prompts_per_step}x{config.rollout.group_size} episodes. "
        f"The model writes the tag content only (action template {config.env.action_template!r})."
    )
