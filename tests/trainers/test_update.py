"""Clip-higher matters only when a batch gets several optimizer steps: with one, the PPO ratio is always 1."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl_llm.agents.tiny import tiny_model
from rl_llm.trainers.batch import TrainBatch
from rl_llm.trainers.config import load_config
from rl_llm.trainers.default_job import DEFAULT_JOB
from rl_llm.trainers.update import policy_update


def make_batch(rows: int = 8, width: int = 12, policy_tokens: int = 4) -> tuple[TrainBatch, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    # Two completions, each sampled by half the group (as when a group agrees): a later minibatch sees the
    # same tokens an earlier step already pushed up or down, so its ratios leave [1 - clip_low, 1 + clip_high].
    input_ids = torch.randint(10, 1000, (2, width), generator=generator).repeat(rows // 2, 1)
    policy_mask = torch.zeros((rows, width), dtype=torch.bool)
    policy_mask[:, -policy_tokens:] = True
    scores = torch.tensor([1.0, -1.0] * (rows // 2))
    batch = TrainBatch(
        input_ids=input_ids, attention_mask=torch.ones_like(input_ids), policy_mask=policy_mask,
        old_logprobs=torch.zeros((rows, width)), token_rewards=torch.zeros((rows, width)), scores=scores,
        group_ids=torch.zeros(rows, dtype=torch.long), policy_versions=torch.zeros(rows, dtype=torch.long),
    )  # fmt: skip
    return batch, scores[:, None] * policy_mask.float()


def updated_weights(clip_high: float, epochs: int, minibatches: int) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    config = load_config(overrides=[f"loss.clip_high={clip_high}", "loss.clip_low=0.2", f"optim.epochs={epochs}",
                                    f"optim.minibatches={minibatches}", "optim.micro_batch_size=4"], base=DEFAULT_JOB)  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(tiny_model())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch, advantages = make_batch()
    stats = policy_update(model, optimizer, batch, advantages, config, torch.Generator().manual_seed(0))
    return {name: p.detach().clone() for name, p in model.named_parameters()}, stats


def test_clip_high_is_inert_with_one_optimizer_step_per_batch() -> None:
    low, stats = updated_weights(clip_high=0.2, epochs=1, minibatches=1)
    high, _ = updated_weights(clip_high=1000.0, epochs=1, minibatches=1)
    assert stats["clip_frac"] == 0.0
    assert all(torch.equal(low[name], high[name]) for name in low)


@pytest.mark.parametrize(("epochs", "minibatches"), [(1, 4), (2, 2)])
def test_clip_high_changes_the_update_with_several_optimizer_steps(epochs: int, minibatches: int) -> None:
    low, stats = updated_weights(clip_high=0.2, epochs=epochs, minibatches=minibatches)
    high, _ = updated_weights(clip_high=1000.0, epochs=epochs, minibatches=minibatches)
    assert stats["clip_frac"] > 0.0  # later steps see ratios outside [0.8, 1.2]
    assert any(not torch.equal(low[name], high[name]) for name in low)


def test_the_shipped_jobs_that_set_clip_high_take_several_optimizer_steps() -> None:
    from pathlib import Path

    configs = sorted((Path(__file__).resolve().parents[2] / "configs").glob("bandit_*.yaml"))
    for config in [load_config(overrides=[], base=DEFAULT_JOB), *(load_config(path) for path in configs)]:
        if config.loss.clip_high != config.loss.clip_low:
            assert config.optim.epochs * config.optim.minibatches > 1, config


def test_a_config_where_clip_high_is_inert_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING"):
        load_config(overrides=["optim.minibatches=1", "optim.epochs=1", "loss.clip_high=0.28"], base=DEFAULT_JOB)
    assert "clip_high=0.28 is inert" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        load_config(overrides=["optim.minibatches=2", "loss.clip_high=0.28"], base=DEFAULT_JOB)
    assert "inert" not in caplog.text
