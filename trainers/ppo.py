"""Trajectory-level PPO with a critic: one loop, top to bottom.

Each step: collect episodes -> score -> the critic's value for every token -> GAE over policy tokens only
(env and prompt tokens are skipped; each turn's reward sits on its last policy token), with separate
lambdas for the actor's advantages and the critic's targets (VC-PPO) -> critic regression and clipped
policy updates over minibatches -> sync the new weights to the generator -> log and checkpoint.
``ppo.critic_warmup_steps`` trains the critic alone first (VC-PPO value pretraining).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rl_llm.trainers.advantages import decoupled_gae, masked_whiten
from rl_llm.trainers.config import TrainConfig
from rl_llm.trainers.runner import StepTimer, TrainingRun
from rl_llm.trainers.turn_credit import turn_decoupled_gae
from rl_llm.trainers.update import batched_values, critic_update, policy_update


def train_ppo(config: TrainConfig, run_dir: str | Path) -> dict[str, Any]:
    if config.algorithm != "ppo":
        raise ValueError(f"algorithm {config.algorithm!r} trains with rl_llm.trainers.grpo.train_grpo")
    started = time.perf_counter()
    run = TrainingRun(config, run_dir, with_critic=True)  # resumes from run_dir/checkpoints when one is there
    ppo = config.ppo
    try:
        before = run.evaluate_before()
        with run.progress() as progress:
            for step in range(run.step + 1, config.steps + 1):
                timer = StepTimer()
                # 1. Collect episodes with the current weights.
                with timer("rollout"):
                    trajectories = run.collect()
                # 2. Score and pad.
                with timer("score"):
                    batch = run.score(trajectories)
                    # 3. Values and GAE over policy tokens (actor lambda for advantages, critic lambda for targets).
                    with run.critic_precision.autocast():
                        values = batched_values(run.critic, batch, config.optim.micro_batch_size)
                    if config.advantage.turn_level:  # discount per turn, not per token (trainers/turn_credit.py)
                        advantages, returns = turn_decoupled_gae(run.scored, batch, values, config.advantage.gamma,
                                                                 ppo.lam_actor, ppo.lam_critic)  # fmt: skip
                    else:
                        advantages, returns = decoupled_gae(
                            batch.token_rewards, values, batch.policy_mask, ppo.gamma, ppo.lam_actor, ppo.lam_critic
                        )
                    if ppo.whiten_advantages:
                        advantages = masked_whiten(advantages, batch.policy_mask)
                # 4. Update the critic, then (after the value warm-up) the policy.
                with timer("update"):
                    stats = critic_update(run.critic, run.critic_optimizer, batch, values, returns, config, run.shuffle,
                                          run.critic_precision)  # fmt: skip
                    if step > ppo.critic_warmup_steps:
                        stats |= policy_update(run.model, run.optimizer, batch, advantages, config, run.shuffle,
                                               run.reference_fn, run.scheduler, run.precision)  # fmt: skip
                # 5. Sync the new weights to the generator.
                with timer("sync"):
                    if step > ppo.critic_warmup_steps:
                        run.sync.push(run.model)
                # 6. Log, evaluate and checkpoint.
                run.log_step(step, trajectories, batch, stats, timer, progress)
        return run.finish(before, started)
    finally:
        run.close()
