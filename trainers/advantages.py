"""Advantage estimators of the PPO / GRPO family (docs/research-protocols.md#policy-gradient-estimators).

Outcome estimators (GRPO, Dr. GRPO, RLOO, REINFORCE) turn one scalar return per trajectory into one scalar
advantage, which ``broadcast`` copies onto every policy token of that trajectory (all turns alike). GAE works
per token with a critic and walks over policy tokens only: prompt and env tokens are not actions, so they
neither discount nor bootstrap; the value of the next *policy* token is the bootstrap target.

Groups are integer ids (one per ``task_id``); every function is vectorised over the batch.
"""

from __future__ import annotations

import torch

OUTCOME_ESTIMATORS = ("grpo", "drgrpo", "rloo", "reinforce")


def _group_stats(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-trajectory group size, group mean and unbiased group std (std 0 for groups of one)."""
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    rewards = rewards.to(torch.float64)
    # on the rewards' device: a CPU accumulator fails (or copies) as soon as the rewards live on a GPU
    sums = torch.zeros(len(counts), dtype=torch.float64, device=rewards.device).index_add_(0, inverse, rewards)
    means = sums / counts
    squares = torch.zeros_like(sums).index_add_(0, inverse, (rewards - means[inverse]) ** 2)
    stds = torch.where(counts > 1, (squares / (counts - 1).clamp(min=1)).sqrt(), torch.zeros_like(squares))
    return counts[inverse], means[inverse], stds[inverse]


def grpo(rewards: torch.Tensor, group_ids: torch.Tensor, scale_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: ``(R - mean_G) / (std_G + eps)``; Dr. GRPO is ``scale_by_std=False``.

    A group of one has no baseline: mean 0 and std 1, as verl does, so its advantage is its reward.
    """
    size, mean, std = _group_stats(rewards, group_ids)
    single = size == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    advantages = rewards.to(torch.float64) - mean
    if scale_by_std:
        advantages = advantages / torch.where(single, torch.ones_like(std), std + eps)
    return advantages.to(rewards.dtype)


def drgrpo(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO: ``R - mean_G`` (no std normalisation; pair it with ``seq_sum_constant`` aggregation)."""
    return grpo(rewards, group_ids, scale_by_std=False)


def rloo(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out: ``R_i - mean_{j != i} R_j`` = ``n/(n-1) (R_i - mean_G)``.

    A group of one has no other member, so its baseline is 0 (as verl does).
    """
    size, mean, _ = _group_stats(rewards, group_ids)
    size = size.to(torch.float64)
    leave_one_out = torch.where(size > 1, (mean * size - rewards.to(torch.float64)) / (size - 1).clamp(min=1), 0.0)
    return (rewards.to(torch.float64) - leave_one_out).to(rewards.dtype)


def reinforce(rewards: torch.Tensor, group_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Plain REINFORCE: the return itself, no baseline."""
    return rewards.clone()


def outcome_advantages(name: str, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Dispatch by estimator name (one of ``OUTCOME_ESTIMATORS``)."""
    estimators = {"grpo": grpo, "drgrpo": drgrpo, "rloo": rloo, "reinforce": reinforce}
    if name not in estimators:
        raise ValueError(f"unknown outcome estimator {name!r}; choose from {OUTCOME_ESTIMATORS}")
    return estimators[name](rewards, group_ids)


def broadcast(advantages: torch.Tensor, policy_mask: torch.Tensor) -> torch.Tensor:
    """One advantage per trajectory ``[N]`` -> the same value on each of its policy tokens ``[N, T]``."""
    return advantages[:, None].to(torch.float32) * policy_mask.to(torch.float32)


def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    policy_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the policy tokens of each row; returns (advantages, returns).

    ``token_rewards``, ``values`` and ``policy_mask`` are ``[N, T]``. Positions where the mask is 0 are skipped:
    the recursion carries straight through them, so the token after a policy token, for discounting and
    bootstrapping, is the next policy token (possibly turns later). The episode ends after the last policy
    token (bootstrap value 0). ``returns = advantages + values`` on policy tokens, 0 elsewhere.
    """
    if not token_rewards.shape == values.shape == policy_mask.shape:
        raise ValueError(f"shape mismatch: rewards {token_rewards.shape}, values {values.shape}, mask {policy_mask.shape}")
    mask = policy_mask.to(torch.bool)
    rewards = token_rewards.to(torch.float32)
    values = values.detach().to(torch.float32)
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(rewards.shape[0], dtype=torch.float32, device=rewards.device)
    running = torch.zeros_like(next_value)
    for t in range(rewards.shape[1] - 1, -1, -1):
        active = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(active, delta + gamma * lam * running, running)
        next_value = torch.where(active, values[:, t], next_value)
        advantages[:, t] = torch.where(active, running, torch.zeros_like(running))
    returns = (advantages + values) * mask
    return advantages, returns


def decoupled_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    policy_mask: torch.Tensor,
    gamma: float = 1.0,
    lam_actor: float = 0.95,
    lam_critic: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """VC-PPO: actor advantages with ``lam_actor``, critic targets (returns) with ``lam_critic``."""
    advantages, _ = gae(token_rewards, values, policy_mask, gamma, lam_actor)
    if lam_critic == lam_actor:
        return advantages, (advantages + values.detach().to(torch.float32)) * policy_mask.to(torch.bool)
    _, returns = gae(token_rewards, values, policy_mask, gamma, lam_critic)
    return advantages, returns


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit variance over the masked entries (unbiased variance, as verl); 0 where masked out."""
    mask_f = mask.to(values.dtype)
    count = mask_f.sum()
    mean = masked_mean(values, mask)
    variance = (((values - mean) ** 2) * mask_f).sum() / (count - 1).clamp(min=1)
    return (values - mean) * torch.rsqrt(variance + eps) * mask_f
