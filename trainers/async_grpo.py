"""Asynchronous GRPO (and Dr. GRPO, RLOO, REINFORCE): generation overlaps the update. One loop, top to bottom.

Set ``rollout.max_staleness=N``. A background thread (``BackgroundRollouts``) plays the episodes of the coming
steps with the newest weights it has, at most N policy versions behind the update, while this loop trains on
finished batches: the generator no longer idles during the update, nor the trainer during generation.
``N = 0`` is the synchronous schedule (it reproduces ``grpo.py``'s metrics exactly); the default (unset) runs
``grpo.py`` itself.

Each step: take the next batch of finished groups -> drop episodes more than N versions old (counted;
possible only with partial rollouts) -> score, advantages, clipped updates exactly as in ``grpo.py`` (set
``loss.tis_cap`` for truncated importance weights against the generator's own log-probs, which
corrects both staleness and generator/trainer mismatch) -> publish the new weights -> log and checkpoint,
recording which groups were consumed so a resumed run neither loses nor repeats one.

Backends: ``hf`` (the generator gets its own copy of the model and swaps in each new snapshot between two
generation calls) and ``vllm`` in server mode (the server keeps generating while weights arrive).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rl_llm.trainers.async_rollouts import BackgroundRollouts, RolloutBatch, SeedLedger
from rl_llm.trainers.config import TrainConfig
from rl_llm.trainers.grpo import score_and_update
from rl_llm.trainers.runner import StepTimer, TrainingRun
from rl_llm.types import Trajectory


def train_async_grpo(config: TrainConfig, run_dir: str | Path) -> dict[str, Any]:
    if config.rollout.max_staleness is None:
        raise ValueError("the asynchronous loop needs rollout.max_staleness (0 or more)")
    # Which generators can run asynchronously: trainers/generation.py (check_generation_config) decides.
    started = time.perf_counter()
    run = TrainingRun(config, run_dir)  # resumes from run_dir/checkpoints when one is there
    try:
        before = run.evaluate_before()
        ledger = SeedLedger(run.next_seed, list(run.pending_seeds))
        with run.progress() as progress, BackgroundRollouts(run) as rollouts:
            for step in range(run.step + 1, config.steps + 1):
                timer = StepTimer()
                # 1. Wait for this step's finished groups (generated while earlier updates ran).
                with timer("wait_rollouts"):
                    ready = rollouts.next_batch()
                # 2. Bound the staleness: the update about to run makes version `step`; its data may come from
                #    versions step-1-N .. step-1.
                trajectories, stale = fresh_enough(ready.trajectories, step - 1 - config.rollout.max_staleness)
                run.matches = ready.matches  # a game: both seats of each match, for its advantages and metrics
                # 3-4. Score, advantages and update exactly as grpo.py does (set loss.tis_cap to weight stale
                #      tokens by truncated importance weights against the generator's log-probs).
                batch, stats = score_and_update(run, trajectories, timer)
                # 5. Publish: the generator picks the new weights up for the episodes it starts from now on.
                with timer("sync"):
                    rollouts.publish(run.sync.push(run.model))
                # 6. Record the consumed groups (for exact resume), then log, evaluate and checkpoint.
                ledger.consume(ready.seeds)
                run.next_seed, run.pending_seeds = ledger.next_seed, list(ledger.pending)
                run.log_step(step, trajectories, batch, stats, timer, progress,
                             extra=async_metrics(ready, trajectories, stale, step))  # fmt: skip
        return run.finish(before, started)
    finally:
        run.close()


def fresh_enough(trajectories: list[Trajectory], oldest: int) -> tuple[list[Trajectory], int]:
    """The episodes all of whose turns come from policy version ``oldest`` or newer, and how many were not."""
    kept = [t for t in trajectories if oldest_version(t) >= oldest]
    return kept, len(trajectories) - len(kept)


def oldest_version(trajectory: Trajectory) -> int:
    versions = [int(turn.info.get("policy_version", trajectory.policy_version)) for turn in trajectory.turns]
    return min(versions, default=trajectory.policy_version)


def async_metrics(ready: RolloutBatch, trajectories: list[Trajectory], stale: int, step: int) -> dict[str, float]:
    lags = [step - 1 - oldest_version(t) for t in trajectories] or [0]
    busy = ready.generation_s + ready.idle_s
    return {
        "async/staleness_mean": sum(lags) / len(lags),
        "async/staleness_max": float(max(lags)),
        "async/dropped_stale": float(stale),
        "async/groups": float(len(ready.seeds)),
        "async/paused_episodes": float(ready.paused),
        "async/generation_s": ready.generation_s,
        "async/generator_idle_s": ready.idle_s,
        "async/generator_idle_frac": ready.idle_s / busy if busy > 0 else 0.0,
        **ready.groups,  # dynamic sampling's groups drawn/kept/dropped (trainers/filtering.py)
    }
