"""Asynchronous training (``rollout.max_staleness``): the synchronous schedule reproduced exactly at N=0, the
staleness bound kept, partial rollouts paused and resumed with newer weights, and a killed run resumed with
no group lost or used twice."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rl_llm.trainers.async_rollouts import SeedLedger
from rl_llm.trainers.checkpoint import Checkpointer
from rl_llm.trainers.cli import train_main
from rl_llm.trainers.config import ConfigError, load_config
from rl_llm.trainers.default_job import DEFAULT_JOB
from rl_llm.trainers.logging import read_metrics
from tests.trainers.killed_runs import kill_after_logged_steps, train_command

QUIET = ["log.tensorboard=false", "log.progress=false", "log.plot=false", "eval.baselines=[]"]
SMALL = ["steps=4", "eval.episodes=4", "rollout.group_size=4", "rollout.prompts_per_step=2", *QUIET]
LONG_TAIL = ["env.id=tests.trainers.longtail_env:tests/LongTail-v0", "env.kwargs={}", "env.action_template=null", "sft.episodes=0",
             "rollout.max_new_tokens=3", "rollout.group_size=2", "rollout.prompts_per_step=2",
             "rollout.partial_extra_groups=3", "eval.episodes=2", "log.checkpoint_every=1", *QUIET]  # fmt: skip
# Figures that measure time, not learning: the only ones allowed to differ between two identical runs.
TIMING = ("time/", "throughput/", "async/generation_s", "async/generator_idle")


def learning_figures(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in record.items() if not k.startswith(TIMING)} for record in read_metrics(run_dir / "metrics.jsonl")]


def test_zero_staleness_reproduces_the_synchronous_run(tmp_path: Path) -> None:
    assert train_main(None, SMALL, out=str(tmp_path / "sync")) == 0
    assert train_main(None, [*SMALL, "rollout.max_staleness=0"], out=str(tmp_path / "async")) == 0
    sync, asynchronous = learning_figures(tmp_path / "sync"), learning_figures(tmp_path / "async")
    assert len(sync) == len(asynchronous) == 4
    for a, b in zip(sync, asynchronous, strict=True):
        assert b.pop("async/staleness_max") == 0.0 and b.pop("async/dropped_stale") == 0.0
        b = {k: v for k, v in b.items() if not k.startswith("async/")}
        assert a == b


def test_generation_runs_ahead_but_never_past_the_staleness_bound(tmp_path: Path) -> None:
    overrides = [*SMALL, "steps=5", "rollout.max_staleness=1", "loss.tis_cap=2"]
    assert train_main(None, overrides, out=str(tmp_path)) == 0
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["policy_version"] for r in records] == [1, 2, 3, 4, 5]
    assert all(r["async/staleness_max"] <= 1 and r["async/dropped_stale"] == 0 for r in records)
    assert all(0.0 <= r["async/generator_idle_frac"] <= 1.0 for r in records)
    # Data one version old: the generator's log-probs are the behaviour policy's, no longer the trainer's, and
    # the truncated importance weights correct for it (on fresh data they are 1 up to rounding).
    stale = [r for r in records if r["async/staleness_mean"] > 0]
    assert stale and all(r["loss/logprob_gap_generator"] > 1e-3 for r in stale)
    assert all(abs(r["loss/tis_weight_mean"] - 1) > 1e-4 for r in stale)
    assert abs(records[0]["loss/tis_weight_mean"] - 1) < 1e-4


def test_partial_rollouts_pause_long_episodes_and_resume_them_with_newer_weights(tmp_path: Path) -> None:
    from rl_llm.agents.rollout import EpisodeJob, PausedEpisode, RolloutEngine
    from tests.trainers.longtail_env import LongTailEnv

    config = load_config(None, [*LONG_TAIL, "rollout.max_staleness=1", "rollout.partial_rollouts=true"],
                         base=DEFAULT_JOB)  # fmt: skip
    from rl_llm.agents.hf import HFPolicy
    from rl_llm.agents.llm import SamplingParams

    policy = HFPolicy("tiny", sampling=SamplingParams(max_new_tokens=3))
    engine = RolloutEngine(policy, LongTailEnv, concurrency=8)
    jobs = [EpisodeJob(seed=seed) for seed in range(6)]  # seeds 0 and 3 are 6 turns long, the rest 1 turn
    results = engine.run(jobs, until=lambda finished: len(finished) >= 4)
    paused = [r for r in results if isinstance(r, PausedEpisode)]
    assert sorted(p.job.seed for p in paused) == [0, 3]
    assert all(0 < len(p.trajectory.turns) < 6 for p in paused)
    policy.mark_updated(7)  # new weights arrive between the two runs
    resumed = engine.run([EpisodeJob(seed=p.job.seed, resume=p) for p in paused])
    for trajectory in resumed:
        versions = [turn.info["policy_version"] for turn in trajectory.turns]
        assert len(versions) == 6 and versions[0] == 0 and versions[-1] == 7  # each turn keeps its version
        assert trajectory.end_reason == "terminated" and trajectory.error is None
        policy_tokens = sum(turn.token_end - turn.token_start for turn in trajectory.turns)
        assert policy_tokens == trajectory.num_policy_tokens  # no token lost or recorded twice across the pause
    policy.close()
    assert config.rollout.partial_rollouts


def test_partial_rollouts_train_on_whole_groups(tmp_path: Path) -> None:
    overrides = [*LONG_TAIL, "steps=4", "rollout.max_staleness=1", "rollout.partial_rollouts=true"]
    assert train_main(None, overrides, out=str(tmp_path)) == 0
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert len(records) == 4
    assert sum(r["async/paused_episodes"] for r in records) > 0  # the long episodes did get paused
    for record in records:
        assert record["episode/trained"] + record["async/dropped_stale"] == 2 * record["async/groups"]
        assert record["async/groups"] >= 2


def _train_command(run_dir: Path, steps: int) -> list[str]:
    overrides = [*LONG_TAIL, f"steps={steps}", "rollout.max_staleness=1", "rollout.partial_rollouts=true"]
    return train_command(run_dir, overrides)


def _ledger(run_dir: Path, step: int) -> SeedLedger:
    _, state = Checkpointer(run_dir / "checkpoints").load(run_dir / "checkpoints" / f"step_{step:06d}")
    return SeedLedger(state["next_seed"], state["pending_seeds"])


def test_a_killed_async_run_resumes_without_losing_or_repeating_a_group(tmp_path: Path) -> None:
    steps = 6
    # step 2 logged: generation of later steps under way
    kill_after_logged_steps(_train_command(tmp_path, steps), tmp_path / "metrics.jsonl", 2)
    saved = int((tmp_path / "checkpoints" / "latest").read_text().strip().removeprefix("step_"))
    at_kill = _ledger(tmp_path, saved)

    assert train_main(None, _train_command(tmp_path, steps)[4:-2], out=str(tmp_path)) == 0
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    final = _ledger(tmp_path, steps)
    consumed = sum(int(r["async/groups"]) for r in records)
    # Every group below next_seed was consumed exactly once or is still pending (the ledger refuses a second
    # consumption outright), and the groups pending at the kill were played again and consumed after it.
    assert consumed == final.next_seed - len(final.pending)
    assert not set(at_kill.pending) & set(final.pending)


def test_the_seed_ledger_refuses_a_group_consumed_twice() -> None:
    ledger = SeedLedger(next_seed=0)
    ledger.consume([0, 1, 4])
    assert (ledger.next_seed, ledger.pending) == (5, [2, 3])
    ledger.consume([3])
    assert ledger.pending == [2]
    with pytest.raises(RuntimeError, match="consumed twice"):
        ledger.consume([1])


@pytest.mark.parametrize("override, message", [
    (["rollout.max_staleness=-1"], "max_staleness"),
    (["rollout.partial_rollouts=true"], "needs the asynchronous loop"),
    (["rollout.max_staleness=1", "algorithm=ppo"], "GRPO-family"),
    (["rollout.max_staleness=1", "rollout.backend=vllm"], "needs rollout.vllm.mode=server"),  # colocate: refused
])  # fmt: skip
def test_bad_asynchronous_settings_are_refused(override: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, override, base=DEFAULT_JOB)


def test_the_hf_generator_of_an_async_run_has_its_own_weights(tmp_path: Path) -> None:
    from rl_llm.trainers.runner import TrainingRun

    config = load_config(None, [*SMALL, "rollout.max_staleness=1"], base=DEFAULT_JOB)
    run = TrainingRun(config, tmp_path)
    try:
        generator_weights = dict(run.generator.model.named_parameters())
        for name, parameter in run.model.named_parameters():
            assert generator_weights[name].data_ptr() != parameter.data_ptr()
        # The swap runs in the generator's documented hook; its generate method is its own (not patched).
        assert run.generator.before_generate == run.sync.apply_pending and "generate" not in vars(run.generator)
        with torch.no_grad():
            next(run.model.parameters()).add_(1.0)
        version = run.sync.push(run.model)
        assert version == 1 and run.generator.policy_version == 0  # taken up only at the next generation call
        run.sync.apply_pending()
        assert run.generator.policy_version == 1
        for name, parameter in run.model.named_parameters():
            assert torch.equal(generator_weights[name], parameter)
    finally:
        run.close()
