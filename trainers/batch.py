"""From a list of ``Trajectory`` records to the padded tensors the update step works on.

One trajectory is one sample, whatever its number of turns: its tokens are used exactly as the generator
saw and produced them (no re-tokenisation). Masks are aligned with the tokens: ``policy_mask[i, t]`` says
that token ``t`` was sampled by the policy, so its log-prob (computed from the logits at ``t - 1``) carries
loss, KL and entropy; prompt and env tokens are context only. Each turn's reward sits on that turn's last
policy token (verl's convention, extended to many turns); a transformed score (OTC, ...) replaces the
trajectory's total by adding the difference on its final policy token.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from rl_llm.types import TokenRole, Trajectory


@dataclass
class TrainBatch:
    input_ids: torch.Tensor  # [N, T] long, right-padded
    attention_mask: torch.Tensor  # [N, T] long
    policy_mask: torch.Tensor  # [N, T] bool
    old_logprobs: torch.Tensor  # [N, T] float, generator log-probs on policy tokens, 0 elsewhere
    token_rewards: torch.Tensor  # [N, T] float
    scores: torch.Tensor  # [N] float, the trajectory's (transformed) return
    group_ids: torch.Tensor  # [N] long, one id per task_id
    policy_versions: torch.Tensor  # [N] long

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device | str) -> TrainBatch:
        return TrainBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def select(self, indices: torch.Tensor | Sequence[int]) -> TrainBatch:
        """The rows ``indices``, trimmed to their longest sequence (so small micro-batches stay short)."""
        index = torch.as_tensor(indices, dtype=torch.long, device=self.input_ids.device)
        rows = {f.name: getattr(self, f.name)[index] for f in fields(self)}
        length = int(rows["attention_mask"].sum(dim=1).max()) if len(index) else 0
        for name in ("input_ids", "attention_mask", "policy_mask", "old_logprobs", "token_rewards"):
            rows[name] = rows[name][:, :length]
        return TrainBatch(**rows)

    @property
    def num_policy_tokens(self) -> int:
        return int(self.policy_mask.sum())


def group_index(task_ids: Sequence[str]) -> list[int]:
    """Consecutive integer ids for task ids, in order of first appearance."""
    ids: dict[str, int] = {}
    return [ids.setdefault(task, len(ids)) for task in task_ids]


def _reward_positions(trajectory: Trajectory, policy_positions: list[int]) -> list[int]:
    """Index of the token that receives each turn's reward: the last policy token the turn produced.

    A turn that produced no token (an empty completion) gives its reward to the latest policy token before
    it, or to the first policy token when there is none.
    """
    positions = []
    for turn in trajectory.turns:
        before = bisect.bisect_left(policy_positions, turn.token_end)  # policy positions < token_end
        positions.append(policy_positions[before - 1] if before else policy_positions[0])
    return positions


def collate(
    trajectories: Sequence[Trajectory], pad_token_id: int, scores: Sequence[float] | None = None
) -> TrainBatch:
    """Pad ``trajectories`` into a ``TrainBatch``; ``scores`` (default: each total reward) are the returns."""
    if not trajectories:
        raise ValueError("cannot build a batch from zero trajectories")
    if scores is not None and len(scores) != len(trajectories):
        raise ValueError(f"got {len(scores)} scores for {len(trajectories)} trajectories")
    width = max(len(t.token_ids) for t in trajectories)
    n = len(trajectories)
    # Built on the CPU whatever the default device (row by row on a GPU would be one small copy per row);
    # the caller moves the whole batch with ``.to(device)``.
    cpu = torch.device("cpu")
    input_ids = torch.full((n, width), pad_token_id, dtype=torch.long, device=cpu)
    attention_mask = torch.zeros((n, width), dtype=torch.long, device=cpu)
    policy_mask = torch.zeros((n, width), dtype=torch.bool, device=cpu)
    old_logprobs = torch.zeros((n, width), dtype=torch.float32, device=cpu)
    token_rewards = torch.zeros((n, width), dtype=torch.float32, device=cpu)
    totals = []
    for row, trajectory in enumerate(trajectories):
        length = len(trajectory.token_ids)
        if not len(trajectory.token_roles) == len(trajectory.logprobs) == length:
            raise ValueError(
                f"trajectory {row} ({trajectory.task_id}): {length} token ids, {len(trajectory.token_roles)} roles, "
                f"{len(trajectory.logprobs)} log-probs; they must match"
            )
        policy_positions = [i for i, role in enumerate(trajectory.token_roles) if role == TokenRole.POLICY]
        if not policy_positions:
            raise ValueError(f"trajectory {row} ({trajectory.task_id}) has no policy tokens; drop it before collate")
        input_ids[row, :length] = torch.tensor(trajectory.token_ids, dtype=torch.long, device=cpu)
        attention_mask[row, :length] = 1
        policy_mask[row, policy_positions] = True
        old_logprobs[row, :length] = torch.tensor(trajectory.logprobs, dtype=torch.float32, device=cpu)
        for position, turn in zip(_reward_positions(trajectory, policy_positions), trajectory.turns, strict=True):
            token_rewards[row, position] += turn.reward
        total = trajectory.total_reward if scores is None else float(scores[row])
        token_rewards[row, policy_positions[-1]] += total - trajectory.total_reward
        totals.append(total)
    old_logprobs *= policy_mask
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        policy_mask=policy_mask,
        old_logprobs=old_logprobs,
        token_rewards=token_rewards,
        scores=torch.tensor(totals, dtype=torch.float32, device=cpu),
        group_ids=torch.tensor(group_index([t.task_id for t in trajectories]), dtype=torch.long, device=cpu),
        policy_versions=torch.tensor([t.policy_version for t in trajectories], dtype=torch.long, device=cpu),
    )


def minibatch_indices(size: int, num_minibatches: int, generator: torch.Generator | None = None) -> list[torch.Tensor]:
    """A shuffled split of ``range(size)`` into ``num_minibatches`` near-equal parts (none empty)."""
    if not 1 <= num_minibatches <= size:
        raise ValueError(f"need 1 <= minibatches <= batch size ({size}), got {num_minibatches}")
    # Drawn where the generator lives (the CPU for the trainer's shuffle), not on the default device: randperm
    # refuses a generator of another device. Callers move the indices to the batch's device.
    device = generator.device if generator is not None else torch.device("cpu")
    permutation = torch.randperm(size, generator=generator, device=device)
    return [part for part in torch.tensor_split(permutation, num_minibatches) if len(part)]


def micro_batches(indices: torch.Tensor, micro_batch_size: int) -> list[torch.Tensor]:
    """Split one minibatch's indices into chunks of at most ``micro_batch_size`` (gradient accumulation)."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    return list(torch.split(indices, micro_batch_size))
