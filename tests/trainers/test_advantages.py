"""Advantage estimators against values worked out by hand on small tensors."""

from __future__ import annotations

import math

import pytest
import torch

from rl_llm.trainers.advantages import (
    broadcast,
    decoupled_gae,
    drgrpo,
    gae,
    grpo,
    masked_whiten,
    outcome_advantages,
    reinforce,
    rloo,
)

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 5.0])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 2])


def test_grpo_normalises_by_group_mean_and_unbiased_std() -> None:
    # group 0: mean 0.5, unbiased std sqrt(1/3); group 1: std 0 -> 0; group 2 (size 1): mean 0, std 1.
    expected = [0.5 * math.sqrt(3), -0.5 * math.sqrt(3), -0.5 * math.sqrt(3), 0.5 * math.sqrt(3), 0, 0, 5.0]
    assert torch.allclose(grpo(REWARDS, GROUPS), torch.tensor(expected), atol=1e-5)


def test_grpo_does_not_depend_on_group_order_or_id_values() -> None:
    permutation = torch.tensor([6, 2, 4, 0, 5, 1, 3])
    shuffled = grpo(REWARDS[permutation], GROUPS[permutation] * 7 + 3)
    assert torch.allclose(shuffled, grpo(REWARDS, GROUPS)[permutation])


def test_drgrpo_only_subtracts_the_group_mean() -> None:
    assert torch.allclose(drgrpo(REWARDS, GROUPS), torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 5.0]))


def test_rloo_uses_the_mean_of_the_other_members() -> None:
    # R=1: others (0, 0, 1) mean 1/3 -> 2/3; R=0: others mean 2/3 -> -2/3; lone member: baseline 0.
    expected = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0, 5.0])
    assert torch.allclose(rloo(REWARDS, GROUPS), expected, atol=1e-6)


def test_reinforce_and_dispatch() -> None:
    assert torch.equal(reinforce(REWARDS), REWARDS)
    assert torch.allclose(outcome_advantages("rloo", REWARDS, GROUPS), rloo(REWARDS, GROUPS))
    with pytest.raises(ValueError, match="unknown outcome estimator"):
        outcome_advantages("ppo2", REWARDS, GROUPS)


def test_broadcast_puts_the_advantage_on_policy_tokens_only() -> None:
    mask = torch.tensor([[0, 1, 1, 0, 1], [0, 0, 1, 0, 0]], dtype=torch.bool)
    out = broadcast(torch.tensor([2.0, -1.0]), mask)
    assert torch.equal(out, torch.tensor([[0, 2.0, 2.0, 0, 2.0], [0, 0, -1.0, 0, 0]]))


# prompt, policy, policy, env, env, policy, policy, padding
MASK = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 0]], dtype=torch.bool)
VALUES = torch.tensor([[7.0, 1.0, 2.0, 9.0, 9.0, 3.0, 4.0, 8.0]])
TOKEN_REWARDS = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0]])


def test_gae_skips_prompt_and_env_tokens() -> None:
    # Over policy tokens only: v = (1, 2, 3, 4), r = (0, 1, 0, 2), gamma 0.9, lambda 0.5 (gamma*lambda 0.45):
    # A4 = 2 - 4 = -2; A3 = (0.9*4 - 3) + 0.45*A4 = -0.3; A2 = (1 + 0.9*3 - 2) + 0.45*A3 = 1.565;
    # A1 = (0.9*2 - 1) + 0.45*A2 = 1.50425.
    advantages, returns = gae(TOKEN_REWARDS, VALUES, MASK, gamma=0.9, lam=0.5)
    expected = torch.tensor([[0, 1.50425, 1.565, 0, 0, -0.3, -2.0, 0]])
    assert torch.allclose(advantages, expected, atol=1e-5)
    assert torch.allclose(returns, (expected + VALUES) * MASK, atol=1e-5)


def test_gae_with_gamma_and_lambda_one_is_return_to_go_minus_value() -> None:
    advantages, returns = gae(TOKEN_REWARDS, VALUES, MASK, gamma=1.0, lam=1.0)
    assert torch.allclose(advantages, torch.tensor([[0, 2.0, 1.0, 0, 0, -1.0, -2.0, 0]]))
    assert torch.allclose(returns, torch.tensor([[0, 3.0, 3.0, 0, 0, 2.0, 2.0, 0]]))


def test_decoupled_gae_uses_separate_lambdas_for_actor_and_critic() -> None:
    advantages, returns = decoupled_gae(TOKEN_REWARDS, VALUES, MASK, gamma=0.9, lam_actor=0.5, lam_critic=1.0)
    assert torch.allclose(advantages, gae(TOKEN_REWARDS, VALUES, MASK, 0.9, 0.5)[0])
    # critic targets: discounted Monte-Carlo return over policy tokens, 0.9-discounted per policy token
    assert torch.allclose(returns, torch.tensor([[0, 0.9 * (1 + 0.81 * 2), 1 + 0.81 * 2, 0, 0, 1.8, 2.0, 0]]))


def test_gae_rows_are_independent() -> None:
    two_rows = torch.cat([TOKEN_REWARDS, TOKEN_REWARDS.flip(1)])
    values = torch.cat([VALUES, VALUES.flip(1)])
    mask = torch.cat([MASK, MASK.flip(1)])
    advantages, _ = gae(two_rows, values, mask, 0.9, 0.5)
    assert torch.allclose(advantages[0], gae(TOKEN_REWARDS, VALUES, MASK, 0.9, 0.5)[0][0])


def test_masked_whiten_ignores_masked_entries() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    out = masked_whiten(values, torch.tensor([[1, 1, 1, 0]]))
    assert torch.allclose(out, torch.tensor([[-1.0, 0.0, 1.0, 0.0]]), atol=1e-4)
