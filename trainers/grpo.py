"""Trajectory-level GRPO (and Dr. GRPO, RLOO, REINFORCE): one loop, top to bottom.

Each step: collect ``group_size`` episodes for each of ``prompts_per_step`` new tasks with the current
weights -> score them (returns, optional OTC reward, optional PODS down-sampling) -> one advantage per
episode relative to its group (same ``task_id``), copied onto every policy token of every turn -> clipped
policy-gradient updates over minibatches -> sync the new weights to the generator -> log and checkpoint.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rl_llm.trainers.advantages import broadcast, outcome_advantages
from rl_llm.trainers.batch import TrainBatch
from rl_llm.trainers.config import TrainConfig
from rl_llm.trainers.runner import StepTimer, TrainingRun
from rl_llm.trainers.update import policy_update
from rl_llm.types import Trajectory


def train_grpo(config: TrainConfig, run_dir: str | Path) -> dict[str, Any]:
    if config.algorithm == "ppo":
        raise ValueError("algorithm 'ppo' trains with rl_llm.trainers.ppo.train_ppo")
    started = time.perf_counter()
    run = TrainingRun(config, run_dir)  # resumes from run_dir/checkpoints when one is there
    try:
        before = run.evaluate_before()
        with run.progress() as progress:
            for step in range(run.step + 1, config.steps + 1):
                timer = StepTimer()
                # 1. Collect: G episodes per task, all with the weights of policy version `step - 1`.
                with timer("rollout"):
                    trajectories = run.collect()
                # 2-4. Score, advantages, update (below).
                batch, stats = score_and_update(run, trajectories, timer)
                # 5. Sync: the generator uses the new weights from now on (policy version + 1).
                with timer("sync"):
                    run.sync.push(run.model)
                # 6. Log, evaluate and checkpoint.
                run.log_step(step, trajectories, batch, stats, timer, progress)
        return run.finish(before, started)
    finally:
        run.close()


def score_and_update(run: TrainingRun, trajectories: list[Trajectory], timer: StepTimer) -> tuple[TrainBatch, dict]:
    """Steps 2-4 of a GRPO-family step (shared with the asynchronous loop, ``async_grpo.py``)."""
    config = run.config
    # 2. Score: returns, reward transforms, down-sampling; pad into tensors.
    with timer("score"):
        batch = run.score(trajectories)
        # 3. Advantages: group-relative, the same on every policy token of an episode; in a two-player game the
        # per-round credit of trainers/social.py (per-round RLOO over the seed group, Advantage Alignment).
        if run.matches is not None:
            from rl_llm.trainers.social import game_advantages

            advantages = game_advantages(run.scored, run.matches, config, batch.policy_mask, batch.scores)
        elif config.algorithm == "gigpo" or config.advantage.turn_level:  # per-turn credit (trainers/turn_credit.py)
            from rl_llm.trainers.turn_credit import turn_advantages

            advantages = turn_advantages(config, run.scored, batch)
        else:
            advantages = broadcast(outcome_advantages(config.algorithm, batch.scores, batch.group_ids), batch.policy_mask)
    # 4. Update: PPO-clip minibatch steps with gradient accumulation (+ optional k3 KL, TIS weights).
    with timer("update"):
        stats = policy_update(run.model, run.optimizer, batch, advantages, config, run.shuffle,
                              run.reference_fn, run.scheduler, run.precision)  # fmt: skip
    return batch, stats
