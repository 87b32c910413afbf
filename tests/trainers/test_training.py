"""End-to-end training on CPU with the tiny model: GRPO and PPO raise the held-out return, and a run killed
mid-step resumes from its last checkpoint with nothing logged lost or duplicated."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from rl_llm.trainers.cli import train_main
from rl_llm.trainers.config import load_config
from rl_llm.trainers.default_job import DEFAULT_JOB
from rl_llm.trainers.logging import read_metrics
from rl_llm.trainers.runner import TrainingRun
from tests.trainers.killed_runs import kill_after_logged_steps, train_command

REPO = Path(__file__).resolve().parents[2]
QUIET = ["log.tensorboard=false", "log.progress=false", "log.plot=false"]
# The simpler task for PPO: one pull of a fixed 10-armed bandit whose arm k pays k/9 (strategic reward), so
# every valid label earns something and later letters earn more. RL from scratch: no warm start (the default
# job's would already teach the format, leaving too little return to gain for these checks).
ONE_TURN_BANDIT = ["env.kwargs={num_arms: 10, horizon: 1, means: [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],"
                   " reward_mode: strategic, invalid_action_penalty: 3.0}", "sft.episodes=0"]


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_default_job_grpo_raises_the_held_out_return(tmp_path: Path) -> None:
    """The embedded default job, shortened: the same env, model, warm start and algorithm, fewer steps."""
    assert train_main(None, ["steps=5", "eval.episodes=24", *QUIET], out=str(tmp_path)) == 0
    summary = summary_of(tmp_path)
    assert summary["env_id"] == DEFAULT_JOB["env"]["id"] and summary["steps"] == 5
    # The warm start (random baseline's episodes) teaches the format: the untrained model's turns are almost
    # all invalid (-3 each), the warm-started one's almost all valid, with no arm preferred.
    warm = json.loads((tmp_path / "warm_start.json").read_text())
    untrained_invalid = warm["untrained"]["values"]["invalid_actions"]  # per held-out episode, of 4 turns
    assert warm["baseline"] == "random" and sum(untrained_invalid) / len(untrained_invalid) > 3.0
    assert summary["before"]["invalid_actions"] < 0.5 and summary["before"]["best_arm_share"] < 0.6, summary
    # Then GRPO moves the choices onto the best arm (mean 0.9; return 4 is the optimum), past UCB's return.
    assert summary["return_after"] > summary["return_before"] + 1.0, summary
    assert summary["after"]["best_arm_share"] > 0.8 and summary["return_after"] > summary["baselines"]["ucb"]["return"]
    assert {"return_before", "return_after", "baseline_random", "steps"} <= summary.keys()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == list(range(1, 6))
    assert (tmp_path / "model" / "config.json").exists()


@pytest.mark.timeout(1800)  # about 10 CPU minutes: 5.5 min wall on 2 idle cores, longer on one
def test_tictactoe_config_grpo_raises_the_win_rate_over_the_warm_start(tmp_path: Path) -> None:
    """The shipped CPU tic-tac-toe job, whole: the README's claim for seed 0."""
    config = REPO / "configs" / "tictactoe_grpo_cpu.yaml"
    # The figures were measured with 2 torch threads (benchmarks/tictactoe_job.py); an in-process vLLM engine
    # earlier in the session may have set the process to 1, and the thread count changes float sums.
    threads = torch.get_num_threads()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    try:
        assert train_main(str(config), QUIET, out=str(tmp_path)) == 0
    finally:
        torch.set_num_threads(threads)
    summary = summary_of(tmp_path)
    untrained, before, after = summary["untrained"], summary["before"], summary["after"]
    # Untrained, every first move is illegal (an illegal move loses at once); the minimax warm start teaches
    # the move format and part of legality, and wins some games.
    assert untrained["win"] == 0.0 and untrained["illegal_moves"] > 0.9, untrained
    assert before["illegal_moves"] < 0.7 and before["win"] > 0.1, before
    # GRPO then wins more of the same held-out games (paired: the same 100 seeds) and plays fewer illegal moves,
    # ending above the random baseline's win rate (measured for seed 0: 0.32 -> 0.63, illegal 0.45 -> 0.12).
    wins_before = json.loads((tmp_path / "eval_before.json").read_text())["values"]["win"]
    wins_after = json.loads((tmp_path / "eval_after.json").read_text())["values"]["win"]
    assert len(wins_before) == len(wins_after) == 100
    assert sum(wins_after) - sum(wins_before) >= 15, (sum(wins_before), sum(wins_after))
    assert after["illegal_moves"] < before["illegal_moves"] - 0.15, (before, after)
    assert after["win"] > summary["baselines"]["random"]["win"], summary["baselines"]


def test_ppo_with_a_critic_raises_the_return_on_a_one_turn_bandit(tmp_path: Path) -> None:
    overrides = ["algorithm=ppo", "steps=20", "eval.episodes=24", "rollout.prompts_per_step=8", "optim.lr=1e-2",
                 *ONE_TURN_BANDIT, *QUIET]  # fmt: skip
    assert train_main(None, overrides, out=str(tmp_path)) == 0
    summary = summary_of(tmp_path)
    assert summary["algorithm"] == "ppo"
    assert summary["return_after"] > summary["return_before"] + 1.0, summary
    last = read_metrics(tmp_path / "metrics.jsonl")[-1]
    assert "loss/value_loss" in last and "loss/policy_loss" in last


def _train_command(run_dir: Path, steps: int) -> list[str]:
    overrides = [f"steps={steps}", "log.checkpoint_every=2", "log.tensorboard=true", "log.progress=false",
                 "log.plot=false", "eval.episodes=4", "rollout.prompts_per_step=2", "rollout.group_size=4",
                 *ONE_TURN_BANDIT]  # fmt: skip
    return train_command(run_dir, overrides)


def test_killed_run_resumes_and_its_logs_stay_exact(tmp_path: Path) -> None:
    steps = 9
    metrics = tmp_path / "metrics.jsonl"
    kill_after_logged_steps(_train_command(tmp_path, steps), metrics, 3)  # step 3 logged: now inside step 4
    before_kill = read_metrics(metrics)
    latest = (tmp_path / "checkpoints" / "latest").read_text().strip()
    saved_step = int(latest.removeprefix("step_"))
    assert 2 <= saved_step < steps

    # Resume (same command, same --out) in this process and run to the end.
    assert train_main(None, _train_command(tmp_path, steps)[4:-2], out=str(tmp_path)) == 0
    records = read_metrics(metrics)
    assert [r["step"] for r in records] == list(range(1, steps + 1))  # nothing lost, nothing twice
    assert records[:saved_step] == before_kill[:saved_step]  # checkpointed history kept as written
    assert [r["policy_version"] for r in records] == list(range(1, steps + 1))  # the weights' lineage continues
    assert summary_of(tmp_path)["resumed_from_step"] == saved_step

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert [event.step for event in events.Scalars("reward/mean")] == list(range(1, steps + 1))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_restored_run_has_exactly_the_saved_state(tmp_path: Path, lora: bool) -> None:
    if lora:
        pytest.importorskip("peft", reason="LoRA needs peft (pip install 'rl-llm[trl]')")
    config = load_config(overrides=["algorithm=ppo", "steps=3", f"model.lora.enabled={lora}", *ONE_TURN_BANDIT, *QUIET])
    run = TrainingRun(config, tmp_path, with_critic=True)
    for model, optimizer in [(run.model, run.optimizer), (run.critic, run.critic_optimizer)]:
        sum((p * torch.randn_like(p)).sum() for p in model.parameters()).backward()
        optimizer.step()  # moved weights and a non-empty optimizer state
    run.step, run.next_seed = 2, 17
    torch.manual_seed(123)
    run.save_checkpoint()
    expected_draw = torch.rand(3)
    run.close()

    saved_policy = torch.load(tmp_path / "checkpoints" / "step_000002" / "policy.pt")
    assert all("lora_" in name for name in saved_policy) == lora  # LoRA checkpoints hold the adapters only
    restored = TrainingRun(config, tmp_path, with_critic=True)
    assert (restored.step, restored.next_seed, restored.generator.policy_version) == (2, 17, 0)
    assert torch.equal(torch.rand(3), expected_draw)  # RNG continues where the saved run was
    for mine, theirs in [(run.model, restored.model), (run.critic, restored.critic)]:
        for (name, a), b in zip(mine.state_dict().items(), theirs.state_dict().values(), strict=True):
            assert torch.equal(a, b), name
    for mine, theirs in [(run.optimizer, restored.optimizer), (run.critic_optimizer, restored.critic_optimizer)]:
        saved, loaded = mine.state_dict()["state"], theirs.state_dict()["state"]
        assert saved.keys() == loaded.keys() and len(saved) > 0
        assert all(torch.equal(saved[k]["exp_avg_sq"], loaded[k]["exp_avg_sq"]) for k in saved)
    restored.close()


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_the_kl_anchor_of_a_warm_started_run_is_the_warm_started_policy_also_when_resumed(
    tmp_path: Path, lora: bool
) -> None:
    """Under LoRA the reference was the base model with adapters off: the policy from before the warm start
    (the KL at step 0 was 0.05 instead of 0). A resumed warm-started run built it from model.path, LoRA or not."""
    if lora:
        pytest.importorskip("peft", reason="LoRA needs peft (pip install 'rl-llm[trl]')")
    config = load_config(overrides=[*ONE_TURN_BANDIT, *QUIET, "steps=2", f"model.lora.enabled={lora}", "loss.kl_coef=0.1",
                                    "sft.episodes=16", "sft.held_out_episodes=4", "sft.baseline=oracle", "sft.epochs=2",
                                    "sft.lr=0.05"])  # fmt: skip
    run = TrainingRun(config, tmp_path)
    batch = run.score(run.collect())
    ids, mask = batch.input_ids, batch.attention_mask
    from rl_llm.trainers.modeling import token_logprobs

    with torch.no_grad():
        policy = token_logprobs(run.model, ids, mask, positions=batch.policy_mask)[0]
    reference = run.reference.logprobs(ids, mask, 1.0, batch.policy_mask)
    assert torch.allclose(policy, reference, atol=1e-5)  # KL 0 at the first step
    run.step = 1
    run.save_checkpoint()
    run.close()
    resumed = TrainingRun(config, tmp_path)
    assert torch.allclose(resumed.reference.logprobs(ids, mask, 1.0, batch.policy_mask), reference, atol=1e-6)
    resumed.close()


def test_train_main_reports_bad_configs_and_missing_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert train_main(None, ["optim.lrr=1"], out=str(tmp_path)) == 2
    assert "unknown config key 'optim.lrr' (did you mean 'optim.lr'?)" in capsys.readouterr().out
    assert not (tmp_path / "metrics.jsonl").exists()
    assert train_main(None, [f"model.path={tmp_path / 'no-such-model'}"], out=str(tmp_path / "run")) == 2
    assert "is not a local directory" in capsys.readouterr().out
    # an empty path was the working directory, and a directory with no model transformers' several-line error
    assert train_main(None, ["model.path="], out=str(tmp_path / "run2")) == 2
    assert "model.path '' is not a local directory" in capsys.readouterr().out
    (tmp_path / "not-a-model").mkdir()
    assert train_main(None, [f"model.path={tmp_path / 'not-a-model'}"], out=str(tmp_path / "run3")) == 2
    out = capsys.readouterr().out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "holds no model (no config.json)" in errors[0] and out.endswith(errors[0] + "\n"), out
    assert f"with the model at {tmp_path / 'not-a-model'}" in out  # not "the tiny local model"


def test_saving_the_trained_model_draws_no_progress_bar(tmp_path: Path, capfd) -> None:
    """transformers' "Writing model shards" bar came after the run's summary line in piped output (no
    newline between); the export of the model is silent, and leaves the bars as it found them."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from rl_llm.agents.tiny import tiny_model

    path = tiny_model()
    run = SimpleNamespace(run_dir=tmp_path, model=AutoModelForCausalLM.from_pretrained(str(path)),
                          tokenizer=AutoTokenizer.from_pretrained(str(path)))  # fmt: skip
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()  # as in a terminal (the CLI turns them off in pipes only)
    try:
        capfd.readouterr()
        assert TrainingRun.export_model(run) == tmp_path / "model"
        captured = capfd.readouterr()
        assert "Writing model shards" not in captured.out + captured.err
        assert hf_logging.is_progress_bar_enabled()
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()
    assert (tmp_path / "model" / "config.json").is_file()


def test_train_refuses_a_non_empty_directory_that_holds_no_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A person's folder as --out: the trainer's config.yaml replaced theirs, and summary.json, model/... would
    have landed among their files. A directory the trainer wrote stays its own (resume, or start over)."""
    missing = f"model.path={tmp_path / 'no-such-model'}"  # stops the run early, after it has set up --out
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("steps: 2\n")  # a person's own config, named as the trainer names its copy
    (home / "notes.md").write_text("mine")
    assert train_main(None, ["steps=1", missing], out=str(home)) == 2
    assert (f"error: --out {home} is a non-empty directory that holds no training run (no config.yaml saved by "
            "rl-llm train); choose a new or empty --out") in capsys.readouterr().out  # fmt: skip
    assert sorted(path.name for path in home.iterdir()) == ["config.yaml", "notes.md"]
    assert (home / "config.yaml").read_text() == "steps: 2\n"

    run = tmp_path / "run"  # a run stopped before its first checkpoint: the trainer's config.yaml is there
    assert train_main(None, ["steps=1", missing], out=str(run)) == 2
    assert "is not a local directory" in capsys.readouterr().out and (run / "config.yaml").is_file()
    (run / "view.html").write_text("<html>")  # `rl-llm view` writes into run directories too
    assert train_main(None, ["steps=1", missing], out=str(run)) == 2
    out = capsys.readouterr().out
    assert "is not a local directory" in out and "holds no training run" not in out
