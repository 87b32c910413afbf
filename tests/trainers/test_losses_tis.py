"""Truncated importance sampling (``loss.tis_cap``) of the generator/trainer mismatch: the weights by hand, and
the update step on the real tiny model and real rollouts, where it must change nothing when the generator's
log-probs are the trainer's and must reweight (and truncate) when they are not."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rl_llm.agents.hf import HFPolicy
from rl_llm.agents.llm import SamplingParams
from rl_llm.agents.rollout import collect
from rl_llm.agents.tiny import tiny_model
from rl_llm.trainers.advantages import broadcast, grpo
from rl_llm.trainers.batch import collate
from rl_llm.trainers.config import ConfigError, load_config
from rl_llm.trainers.losses import truncated_importance_weights
from rl_llm.trainers.update import policy_update


def test_weights_are_the_ratio_truncated_at_the_cap_without_gradient() -> None:
    old = torch.log(torch.tensor([0.5, 0.3, 0.9, 0.2])).requires_grad_()
    generator = torch.log(torch.tensor([0.5, 0.6, 0.3, 0.01]))
    weights, truncated = truncated_importance_weights(old, generator, cap=2.0)
    # ratios 1, 0.5, 3 (> cap), 20 (> cap)
    assert torch.allclose(weights, torch.tensor([1.0, 0.5, 2.0, 2.0]), atol=1e-6)
    assert truncated.tolist() == [0.0, 0.0, 1.0, 1.0]
    assert not weights.requires_grad
    agree, none = truncated_importance_weights(old, old.detach(), cap=2.0)
    assert torch.equal(agree, torch.ones(4)) and not none.any()


def test_a_cap_below_one_is_rejected() -> None:
    with pytest.raises(ConfigError, match="tis_cap"):
        load_config(overrides=["loss.tis_cap=0.5"])
    assert load_config(overrides=["loss.tis_cap=2"]).loss.tis_cap == 2.0


@pytest.fixture(scope="module")
def setup():
    path = tiny_model()
    torch.manual_seed(0)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    policy = HFPolicy(model, tokenizer, sampling=SamplingParams(max_new_tokens=4, temperature=1.0))
    torch.manual_seed(1)
    rollouts = collect("rl-llm/MultiArmedBandit-v0", policy, seeds=[0, 1], group_size=3,
                       env_kwargs={"num_arms": 3, "horizon": 2})  # fmt: skip
    batch = collate(rollouts, tokenizer.pad_token_id)
    advantages = broadcast(grpo(batch.scores, batch.group_ids) + 1.0, batch.policy_mask)
    return model, batch, advantages


def one_update(model, batch, advantages, *overrides: str) -> tuple[dict[str, float], list[torch.Tensor]]:
    model = copy.deepcopy(model)
    config = load_config(overrides=["optim.lr=1e-2", "rollout.max_new_tokens=4", *overrides])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    stats = policy_update(model, optimizer, batch, advantages, config, torch.Generator().manual_seed(0))
    return stats, [parameter.detach().clone() for parameter in model.parameters()]


def test_matching_log_probs_give_the_loss_without_tis(setup) -> None:
    # The batch's log-probs are the trainer's own (hf generator, same weights), up to float rounding (~1e-7):
    # the weights are 1 to that precision (bit for bit 1 where the two agree exactly, tested above).
    model, batch, advantages = setup
    off, params_off = one_update(model, batch, advantages)
    on, params_on = one_update(model, batch, advantages, "loss.tis_cap=2.0")
    assert on["policy_loss"] == pytest.approx(off["policy_loss"], abs=1e-6)
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(params_off, params_on, strict=True))
    assert on["tis_weight_mean"] == pytest.approx(1.0, abs=1e-5) and on["tis_truncated_frac"] == 0.0
    assert "tis_weight_mean" not in off


def test_mismatched_log_probs_are_reweighted_and_truncated(setup) -> None:
    model, batch, advantages = setup
    mismatched = copy.copy(batch)
    mask = batch.policy_mask
    # A generator that put less mass on half of the tokens (ratio e^1.5 > cap) and more on the others (e^-0.5).
    shift = torch.where(torch.arange(mask.shape[1]) % 2 == 0, -1.5, 0.5).expand_as(mask)
    mismatched.old_logprobs = (batch.old_logprobs + shift) * mask
    off, params_off = one_update(model, mismatched, advantages)
    on, params_on = one_update(model, mismatched, advantages, "loss.tis_cap=2.0")
    truncated_share = float(((shift < 0) & mask).sum() / mask.sum())
    assert on["tis_truncated_frac"] == pytest.approx(truncated_share, abs=1e-5) and 0 < truncated_share < 1
    expected_mean = 2.0 * truncated_share + math.exp(-0.5) * (1 - truncated_share)
    assert on["tis_weight_mean"] == pytest.approx(expected_mean, rel=1e-4)
    assert on["policy_loss"] != pytest.approx(off["policy_loss"])
    assert not all(torch.equal(a, b) for a, b in zip(params_off, params_on, strict=True))
