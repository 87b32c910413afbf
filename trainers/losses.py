"""Token-level losses of the PPO / GRPO family and how they are reduced to one number.

Every function here returns a per-token ``[N, T]`` matrix; ``aggregate`` reduces it over the policy-token mask
with one of the three modes of docs/research-protocols.md#loss-aggregation:

- ``seq_mean_token_mean`` (GRPO): mean over each sequence's tokens, then mean over sequences;
- ``token_mean`` (DAPO): mean over all policy tokens of the batch;
- ``seq_sum_constant`` (Dr. GRPO): each sequence's token sum divided by a fixed constant (the generation
  budget), then mean over sequences, so long and short answers weigh their tokens alike.

With gradient accumulation the caller passes the denominators of the whole minibatch (``num_sequences``,
``num_tokens``), so accumulating micro-batch losses gives exactly the gradient of the full minibatch.
"""

from __future__ import annotations

import torch

AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "seq_sum_constant")
KL_CLAMP = 10.0
LOG_RATIO_CLAMP = 20.0


def aggregate(
    token_losses: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_sequences: int | None = None,
    num_tokens: int | float | None = None,
    constant: float | None = None,
) -> torch.Tensor:
    """Reduce ``[N, T]`` token losses over ``mask`` (see the module docstring for the modes).

    ``num_sequences`` / ``num_tokens`` default to this batch's own counts (sequences with at least one
    policy token; policy tokens); ``constant`` is required by ``seq_sum_constant``.
    """
    mask = mask.to(token_losses.dtype)
    masked = token_losses * mask
    lengths = mask.sum(dim=-1)
    if num_sequences is None:
        num_sequences = int((lengths > 0).sum())
    if mode == "token_mean":
        denominator = float(mask.sum()) if num_tokens is None else float(num_tokens)
        return masked.sum() / max(denominator, 1.0)
    if mode == "seq_mean_token_mean":
        per_sequence = masked.sum(dim=-1) / lengths.clamp(min=1)
        return per_sequence.sum() / max(num_sequences, 1)
    if mode == "seq_sum_constant":
        if constant is None or constant <= 0:
            raise ValueError("seq_sum_constant aggregation needs a positive constant (the generation budget)")
        return masked.sum() / constant / max(num_sequences, 1)
    raise ValueError(f"unknown loss aggregation {mode!r}; choose from {AGGREGATIONS}")


def clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped policy loss per token and whether the clip was active there.

    ``loss = -min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A)`` with ``rho = exp(logp - logp_old)``
    (asymmetric "clip-higher" range when ``clip_high > clip_low``).
    """
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    return loss, (clipped > unclipped).to(loss.dtype)


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip_range: float | None = 0.2
) -> torch.Tensor:
    """``0.5 max((V - R)^2, (clip(V, V_old - eps, V_old + eps) - R)^2)`` per token (unclipped if eps is None)."""
    unclipped = (values - returns) ** 2
    if clip_range is None:
        return 0.5 * unclipped
    clipped_values = old_values + (values - old_values).clamp(-clip_range, clip_range)
    return 0.5 * torch.maximum(unclipped, (clipped_values - returns) ** 2)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || pi_ref): ``exp(ref - logp) - (ref - logp) - 1``, clamped to +-10."""
    log_ratio = (ref_logprobs - logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-KL_CLAMP, KL_CLAMP)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position: ``logsumexp(z) - sum softmax(z) z``."""
    logits = logits.float()
    probabilities = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probabilities * logits).sum(dim=-1)


def truncated_importance_weights(
    old_logprobs: torch.Tensor, generator_logprobs: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance sampling (TIS) of the generator/trainer mismatch, per token, without gradient.

    The tokens were sampled by the generator (vLLM's kernels, or older weights in asynchronous training: the
    behaviour policy, ``generator_logprobs``), while the PPO ratio is taken against the trainer's log-probs of
    the same weights (``old_logprobs``). Weighting each token's policy loss by
    ``min(exp(old_logprobs - generator_logprobs), cap)`` corrects for the difference, truncated at ``cap`` to
    bound the variance (as verl's ``rollout_is`` / TIS and SkyRL do). Returns ``(weights, truncated)``:
    the detached weights and a 0/1 matrix of where the cap was active. Where the two agree the weight is
    exactly 1.
    """
    log_ratio = (old_logprobs.detach() - generator_logprobs.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    truncated = ratio > cap
    return ratio.clamp(max=cap), truncated.to(ratio.dtype)
