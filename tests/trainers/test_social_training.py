"""Two-player training end to end with the tiny model on CPU (docs/multi-agent.md): the same GRPO-family
loop, opponents mixed by weight, per-step game metrics, the before/after evaluation against the game's
baselines with exploitability, samples with both seats of a match, and an exact resume."""

from __future__ import annotations

import json
from pathlib import Path

from rl_llm.trainers.cli import train_main
from rl_llm.trainers.logging import read_metrics

QUICK = ["env.id=social/prisoners_dilemma_v0", "env.kwargs={num_rounds: 2, max_retries: 0}", "env.action_template=<{}>",
         "algorithm=rloo", "rollout.group_size=2", "rollout.prompts_per_step=2", "rollout.max_new_tokens=1",
         "social.opponents={self_play: 1.0, always_defect: 1.0}", "social.advantage_alignment=true",
         "eval.episodes=2", "eval.baselines=[always_defect, tit_for_tat]", "sft.episodes=4", "sft.held_out_episodes=2",
         "sft.baseline=random", "log.tensorboard=false", "log.progress=false", "log.plot=false",
         "log.checkpoint_every=1", "optim.lr=1e-3"]  # fmt: skip


def test_a_game_trains_logs_evaluates_and_resumes(tmp_path: Path) -> None:
    assert train_main(None, [*QUICK, "steps=1"], out=str(tmp_path)) == 0
    assert train_main(None, [*QUICK, "steps=2"], out=str(tmp_path)) == 0  # resumes at step 2
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for name in ("game/return_player_0", "game/return_player_1", "game/welfare", "game/cooperation_rate",
                 "game/tit_for_tat_likeness", "game/self_play_frac", "loss/policy_loss"):  # fmt: skip
        assert name in records[-1], name
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["env_id"] == "social/prisoners_dilemma_v0" and summary["steps"] == 2
    for when in ("before", "after"):
        assert {"return", "exploitability", "return/always_defect", "return/tit_for_tat",
                "opponent_return/always_defect", "welfare/self_play", "cooperation_rate/self_play"} <= summary[when].keys()
    assert summary["game"]["exploiter"] == "always_defect"
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["env_id"] == "social/prisoners_dilemma_v0" and s["seat"] for s in samples)
    warm = json.loads((tmp_path / "warm_start.json").read_text())
    assert warm["expert_policy_tokens"] == 4 * 2 * 2  # 4 expert games, both seats, 2 one-token moves each


def test_a_resumed_game_run_repeats_the_uninterrupted_one(tmp_path: Path) -> None:
    """Opponents are drawn per (run seed, env seed) and sampling is seeded per request: a run stopped after
    step 1 and resumed logs the same step 2 as a run that never stopped."""
    quick = [*QUICK, "sft.episodes=0", "eval.episodes=1"]
    assert train_main(None, [*quick, "steps=2"], out=str(tmp_path / "straight")) == 0
    assert train_main(None, [*quick, "steps=1"], out=str(tmp_path / "resumed")) == 0
    assert train_main(None, [*quick, "steps=2"], out=str(tmp_path / "resumed")) == 0
    straight, resumed = (read_metrics(tmp_path / run / "metrics.jsonl")[-1] for run in ("straight", "resumed"))
    for name in ("game/welfare", "game/return_player_0", "game/cooperation_rate", "reward/mean", "loss/policy_loss",
                 "loss/grad_norm"):  # fmt: skip
        assert resumed[name] == straight[name], name
