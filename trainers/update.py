"""The optimisation step shared by the GRPO and PPO loops: minibatches, gradient accumulation, clipping.

``policy_update`` runs ``epochs`` passes of ``minibatches`` optimizer steps over one batch. Each minibatch is
split into micro-batches (gradient accumulation) whose losses use the minibatch's own denominators, so the
accumulated gradient equals that of the whole minibatch in one pass.

Old log-probs: while the parameters have not moved yet (the first optimizer step of the first epoch) the
current log-probs *are* the old ones, so they are taken detached from the same forward pass; only when a batch
gets more than one optimizer step are they computed up front with an extra no-grad pass.

Precision (``trainers/precision.py``): forward passes run under the ``Precision``'s autocast, ``backward`` and
the optimizer step through it (float16 loss scaling; a step it skips for inf/nan gradients is counted in the
statistics, and the learning-rate schedule does not advance for it). Without one, plain float32.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator

import torch
from torch import nn

from rl_llm.trainers.advantages import masked_mean
from rl_llm.trainers.batch import TrainBatch, micro_batches, minibatch_indices
from rl_llm.trainers.config import TrainConfig
from rl_llm.trainers.losses import (
    aggregate,
    clipped_surrogate,
    k3_kl,
    truncated_importance_weights,
    value_loss,
)
from rl_llm.trainers.modeling import token_logprobs
from rl_llm.trainers.precision import Precision

# (input_ids, attention_mask, temperature, positions) -> reference log-probs [N, T]
ReferenceFn = Callable[[torch.Tensor, torch.Tensor, float, torch.Tensor | None], torch.Tensor]


class Averages:
    """Weighted running means of named figures (weight = policy tokens of the micro-batch)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.weights: dict[str, float] = defaultdict(float)

    def add(self, name: str, value: float, weight: float = 1.0) -> None:
        self.sums[name] += float(value) * weight
        self.weights[name] += weight

    def result(self) -> dict[str, float]:
        return {name: self.sums[name] / self.weights[name] for name in self.sums if self.weights[name] > 0}


@torch.no_grad()
def per_token(batch: TrainBatch, micro_batch_size: int, compute: Callable[[TrainBatch], torch.Tensor]) -> torch.Tensor:
    """``compute(sub_batch) -> [n, width]`` over micro-batches of ``batch``, without gradient, as one ``[N, T]``."""
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    for indices in micro_batches(torch.arange(len(batch), device=batch.input_ids.device), micro_batch_size):
        sub = batch.select(indices)
        out[indices, : sub.input_ids.shape[1]] = compute(sub)
    return out


def batched_logprobs(model: nn.Module, batch: TrainBatch, micro_batch_size: int, temperature: float) -> torch.Tensor:
    return per_token(batch, micro_batch_size, lambda sub: token_logprobs(
        model, sub.input_ids, sub.attention_mask, temperature, positions=sub.policy_mask)[0])  # fmt: skip


def batched_values(critic: nn.Module, batch: TrainBatch, micro_batch_size: int) -> torch.Tensor:
    return per_token(batch, micro_batch_size, lambda sub: critic(sub.input_ids, sub.attention_mask))


def _passes(size: int, config: TrainConfig, generator: torch.Generator) -> Iterator[tuple[int, torch.Tensor]]:
    """(optimizer step number, minibatch indices) for every minibatch of every epoch."""
    number = 0
    for _ in range(config.optim.epochs):
        for indices in minibatch_indices(size, config.optim.minibatches, generator):
            yield number, indices
            number += 1


def policy_update(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: TrainBatch,
    advantages: torch.Tensor,
    config: TrainConfig,
    generator: torch.Generator,
    reference: ReferenceFn | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    precision: Precision | None = None,
) -> dict[str, float]:
    """PPO-clip updates of the policy on ``batch`` with per-token ``advantages``; returns averaged statistics."""
    precision = precision or Precision()
    loss_cfg, optim_cfg = config.loss, config.optim
    temperature = config.rollout.temperature
    micro = optim_cfg.micro_batch_size
    device = batch.input_ids.device
    constant = float(config.rollout.max_new_tokens) if loss_cfg.norm_constant is None else loss_cfg.norm_constant
    several_steps = optim_cfg.epochs * optim_cfg.minibatches > 1
    with precision.autocast():
        old_all = batched_logprobs(model, batch, micro, temperature) if several_steps else None
        ref_all = None
        if reference is not None and loss_cfg.kl_coef:
            ref_all = per_token(batch, micro, lambda sub: reference(
                sub.input_ids, sub.attention_mask, temperature, sub.policy_mask))  # fmt: skip
    parameters = [p for p in model.parameters() if p.requires_grad]
    stats = Averages()
    skipped = 0
    model.train()
    for step_number, indices in _passes(len(batch), config, generator):
        indices = indices.to(device)
        mask_all = batch.policy_mask[indices]
        counts = {
            "num_sequences": int((mask_all.sum(dim=1) > 0).sum()),
            "num_tokens": int(mask_all.sum()),
            "constant": constant,
        }
        optimizer.zero_grad(set_to_none=True)
        for chunk in micro_batches(indices, micro):
            sub = batch.select(chunk)
            width = sub.input_ids.shape[1]
            mask = sub.policy_mask.to(torch.float32)
            with precision.autocast():  # the forward pass; the loss below is float32 (token_logprobs' logits are)
                logprobs, entropy = token_logprobs(
                    model, sub.input_ids, sub.attention_mask, temperature, with_entropy=True,
                    entropy_grad=bool(loss_cfg.entropy_coef), positions=sub.policy_mask,
                )  # fmt: skip
            old = old_all[chunk, :width] if old_all is not None else logprobs.detach()
            pg_tokens, clipped = clipped_surrogate(
                logprobs, old, advantages[chunk, :width], loss_cfg.clip_low, loss_cfg.clip_high
            )
            if loss_cfg.tis_cap is not None:  # generator/trainer mismatch: sub.old_logprobs are the generator's
                tis, truncated = truncated_importance_weights(old, sub.old_logprobs, loss_cfg.tis_cap)
                pg_tokens = pg_tokens * tis
                stats.add("tis_weight_mean", masked_mean(tis, mask), float(mask.sum()))
                stats.add("tis_truncated_frac", masked_mean(truncated, mask), float(mask.sum()))
            loss = aggregate(pg_tokens, mask, loss_cfg.aggregation, **counts)
            weight = float(mask.sum())
            if ref_all is not None:
                kl = k3_kl(logprobs, ref_all[chunk, :width])
                loss = loss + loss_cfg.kl_coef * aggregate(kl, mask, loss_cfg.aggregation, **counts)
                stats.add("kl_ref", masked_mean(kl.detach(), mask), weight)
            if loss_cfg.entropy_coef:
                loss = loss - loss_cfg.entropy_coef * aggregate(entropy, mask, loss_cfg.aggregation, **counts)
            precision.backward(loss)
            stats.add("policy_loss", masked_mean(pg_tokens.detach(), mask), weight)
            stats.add("clip_frac", masked_mean(clipped, mask), weight)
            stats.add("entropy", masked_mean(entropy.detach(), mask), weight)
            stats.add("approx_kl_old", masked_mean(k3_kl(logprobs.detach(), old), mask), weight)
            if step_number == 0:  # trainer vs generator log-probs before any update: should be ~0 (same weights)
                gap = (logprobs.detach() - sub.old_logprobs).abs()
                stats.add("logprob_gap_generator", masked_mean(gap, mask), weight)
        grad_norm = precision.step(optimizer, parameters, optim_cfg.max_grad_norm)
        if grad_norm is None:  # float16 overflow: no update, so the schedule does not advance either
            skipped += 1
            continue
        stats.add("grad_norm", grad_norm)
        if scheduler is not None:
            scheduler.step()
    return stats.result() | precision.stats(skipped)


def critic_update(
    critic: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: TrainBatch,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    config: TrainConfig,
    generator: torch.Generator,
    precision: Precision | None = None,
) -> dict[str, float]:
    """Clipped value-loss regression of the critic onto ``returns`` (token mean over policy tokens)."""
    precision = precision or Precision()
    stats = Averages()
    skipped = 0
    critic.train()
    parameters = [p for p in critic.parameters() if p.requires_grad]
    for _, indices in _passes(len(batch), config, generator):
        indices = indices.to(batch.input_ids.device)
        num_tokens = int(batch.policy_mask[indices].sum())
        optimizer.zero_grad(set_to_none=True)
        for chunk in micro_batches(indices, config.optim.micro_batch_size):
            sub = batch.select(chunk)
            width = sub.input_ids.shape[1]
            mask = sub.policy_mask.to(torch.float32)
            with precision.autocast():
                values = critic(sub.input_ids, sub.attention_mask)  # float32 out (the critic casts its head's)
            tokens = value_loss(values, old_values[chunk, :width], returns[chunk, :width], config.ppo.value_clip)
            loss = config.ppo.value_coef * aggregate(tokens, mask, "token_mean", num_tokens=num_tokens)
            precision.backward(loss)
            stats.add("value_loss", masked_mean(tokens.detach(), mask), float(mask.sum()))
            stats.add("value_mean", masked_mean(values.detach(), mask), float(mask.sum()))
        grad_norm = precision.step(optimizer, parameters, config.optim.max_grad_norm)
        if grad_norm is None:
            skipped += 1
        else:
            stats.add("critic_grad_norm", grad_norm)
    return stats.result() | precision.stats(skipped, prefix="critic_")
