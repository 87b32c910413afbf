"""Reproducible training with the hf backend (docs/reproducibility.md): on CPU the same config and seed give
the same metrics.jsonl whatever the batch composition of generation (which follows thread timing and the
rollout concurrency); on CUDA, the same metrics.jsonl at the same batch layout on the same machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rl_llm.agents.tiny import RECIPE_VERSION
from rl_llm.trainers.cli import train_main
from rl_llm.trainers.logging import read_metrics

QUIET = ["log.tensorboard=false", "log.progress=false", "log.plot=false", "eval.baselines=[]"]
SMALL = ["model.device=cpu", "steps=3", "eval.episodes=4", "rollout.group_size=4", "rollout.prompts_per_step=3", *QUIET]
TIMING = ("time/", "throughput/")  # figures that measure time, not learning


def learning_figures(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in read_metrics(run_dir / "metrics.jsonl")]


def test_the_same_seed_gives_the_same_metrics_whatever_the_batching(tmp_path: Path) -> None:
    # Run b generates in other batches: at most 5 episodes at once, so a turn's requests are split differently
    # and episodes fall out of lock-step. Every sampled token and recorded log-prob must still be the same.
    assert train_main(None, SMALL, out=str(tmp_path / "a")) == 0
    assert train_main(None, [*SMALL, "rollout.concurrency=5"], out=str(tmp_path / "b")) == 0
    a, b = learning_figures(tmp_path / "a"), learning_figures(tmp_path / "b")
    assert len(a) == 3 and a == b
    assert all("loss/logprob_gap_generator" in record for record in a)
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["model_recipe"]["recipe_version"] == RECIPE_VERSION
    assert summary["after"] == json.loads((tmp_path / "b" / "summary.json").read_text())["after"]


def test_another_seed_samples_other_episodes(tmp_path: Path) -> None:
    assert train_main(None, [*SMALL, "steps=1"], out=str(tmp_path / "a")) == 0
    assert train_main(None, [*SMALL, "steps=1", "seed=1"], out=str(tmp_path / "b")) == 0
    assert learning_figures(tmp_path / "a") != learning_figures(tmp_path / "b")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CUDA promise: same machine, same batch layout)")
def test_the_same_run_twice_on_cuda_gives_the_same_metrics(tmp_path: Path) -> None:
    on_cuda = [*SMALL[1:], "model.device=cuda"]
    assert train_main(None, on_cuda, out=str(tmp_path / "a")) == 0
    assert train_main(None, on_cuda, out=str(tmp_path / "b")) == 0
    a, b = learning_figures(tmp_path / "a"), learning_figures(tmp_path / "b")
    assert len(a) == 3 and a == b
