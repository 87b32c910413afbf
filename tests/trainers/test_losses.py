"""Losses and aggregation modes against hand-computed values, masks included."""

from __future__ import annotations

import math

import pytest
import torch

from rl_llm.trainers.losses import aggregate, clipped_surrogate, entropy_from_logits, k3_kl, value_loss


def test_clipped_surrogate_uses_the_asymmetric_range() -> None:
    old = torch.zeros(4)
    new = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5]))
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss, clipped = clipped_surrogate(new, old, advantages, clip_low=0.2, clip_high=0.28)
    # ratio 1.5, A>0: capped at 1.28; A<0: the unclipped 1.5 is the pessimistic term;
    # ratio 0.5, A>0: 0.5 (no clip); A<0: floored at 0.8.
    assert torch.allclose(loss, torch.tensor([-1.28, 1.5, -0.5, 0.8]), atol=1e-6)
    assert clipped.tolist() == [1.0, 0.0, 0.0, 1.0]


def test_clipped_surrogate_gradient_vanishes_where_clipped() -> None:
    new = torch.log(torch.tensor([1.5, 1.1])).requires_grad_()
    loss, _ = clipped_surrogate(new, torch.zeros(2), torch.ones(2), 0.2, 0.2)
    loss.sum().backward()
    assert new.grad[0] == 0 and new.grad[1] == pytest.approx(-1.1)


def test_value_loss_takes_the_larger_of_clipped_and_unclipped() -> None:
    values, old, returns = torch.tensor([2.0, 1.1]), torch.tensor([1.0, 1.0]), torch.tensor([3.0, 0.0])
    # first: clipped value 1.2 is further from 3 -> 0.5 * 1.8^2; second: inside the range -> 0.5 * 1.1^2
    assert torch.allclose(value_loss(values, old, returns, 0.2), torch.tensor([1.62, 0.605]))
    assert torch.allclose(value_loss(values, old, returns, None), torch.tensor([0.5, 0.605]))


def test_k3_kl() -> None:
    logp = torch.log(torch.tensor([0.5, 0.3]))
    ref = torch.log(torch.tensor([0.25, 0.3]))
    expected = 0.5 - math.log(0.5) - 1  # exp(ref - logp) - (ref - logp) - 1 with ref - logp = log 0.5
    assert torch.allclose(k3_kl(logp, ref), torch.tensor([expected, 0.0]), atol=1e-6)
    assert k3_kl(torch.tensor([0.0]), torch.tensor([50.0])).item() == 10.0  # clamped


def test_entropy_from_logits() -> None:
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(entropy_from_logits(logits), torch.tensor([math.log(4), 0.0]), atol=1e-5)


LOSSES = torch.tensor([[1.0, 2.0, 3.0, 50.0], [4.0, 60.0, 70.0, 80.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])


def test_aggregation_modes() -> None:
    assert aggregate(LOSSES, MASK, "token_mean").item() == pytest.approx((6 + 4) / 4)
    assert aggregate(LOSSES, MASK, "seq_mean_token_mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(LOSSES, MASK, "seq_sum_constant", constant=10).item() == pytest.approx((0.6 + 0.4) / 2)
    with pytest.raises(ValueError, match="positive constant"):
        aggregate(LOSSES, MASK, "seq_sum_constant")
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate(LOSSES, MASK, "sum")


def test_sequences_without_policy_tokens_do_not_count() -> None:
    losses = torch.cat([LOSSES, torch.full((1, 4), 9.0)])
    mask = torch.cat([MASK, torch.zeros(1, 4, dtype=torch.long)])
    assert aggregate(losses, mask, "seq_mean_token_mean").item() == pytest.approx(3.0)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_sum_constant"])
def test_accumulated_micro_batches_equal_the_full_batch(mode: str) -> None:
    generator = torch.Generator().manual_seed(0)
    losses = torch.randn(6, 5, generator=generator)
    mask = torch.rand(6, 5, generator=generator) > 0.4
    mask[:, 0] = True
    full = aggregate(losses, mask, mode, constant=7.0)
    counts = {"num_sequences": 6, "num_tokens": int(mask.sum()), "constant": 7.0}
    accumulated = sum(aggregate(losses[i : i + 2], mask[i : i + 2], mode, **counts) for i in range(0, 6, 2))
    assert accumulated.item() == pytest.approx(full.item(), rel=1e-6)
