"""Trajectories -> padded tensors: masks, rewards on the last policy token of each turn, groups."""

from __future__ import annotations

import pytest
import torch

from rl_llm.trainers.batch import collate, group_index, micro_batches, minibatch_indices
from rl_llm.types import TokenRole, Trajectory, Turn

P, A, E = TokenRole.PROMPT, TokenRole.POLICY, TokenRole.ENV


def two_turn_trajectory(task_id: str = "t0") -> Trajectory:
    # 3 prompt tokens, turn 1 = 2 policy tokens, 2 env tokens, turn 2 = 2 policy tokens
    return Trajectory(
        env_id="x",
        task_id=task_id,
        seed=0,
        token_ids=[10, 11, 12, 20, 21, 30, 31, 22, 23],
        token_roles=[P, P, P, A, A, E, E, A, A],
        logprobs=[0, 0, 0, -0.5, -0.25, 0, 0, -1.0, -2.0],
        turns=[Turn("a1", "o1", 0.5, token_start=3, token_end=5), Turn("a2", "", 1.0, token_start=7, token_end=9)],
        policy_version=3,
    )


def one_turn_trajectory(task_id: str) -> Trajectory:
    return Trajectory(
        env_id="x", task_id=task_id, seed=1, token_ids=[10, 40, 41], token_roles=[P, A, A], logprobs=[0, -0.1, -0.2],
        turns=[Turn("a", "", -1.0, token_start=1, token_end=3)],
    )  # fmt: skip


def test_collate_pads_and_masks() -> None:
    batch = collate([two_turn_trajectory(), one_turn_trajectory("t1")], pad_token_id=0)
    assert batch.input_ids.tolist()[1] == [10, 40, 41, 0, 0, 0, 0, 0, 0]
    assert batch.attention_mask.sum(1).tolist() == [9, 3]
    assert batch.policy_mask.int().tolist() == [[0, 0, 0, 1, 1, 0, 0, 1, 1], [0, 1, 1, 0, 0, 0, 0, 0, 0]]
    assert batch.old_logprobs[0].tolist() == [0, 0, 0, -0.5, -0.25, 0, 0, -1.0, -2.0]
    assert batch.policy_versions.tolist() == [3, 0]
    assert batch.num_policy_tokens == 6


def test_each_turn_reward_sits_on_its_last_policy_token() -> None:
    batch = collate([two_turn_trajectory(), one_turn_trajectory("t1")], pad_token_id=0)
    assert batch.token_rewards[0].tolist() == [0, 0, 0, 0, 0.5, 0, 0, 0, 1.0]
    assert batch.token_rewards[1].tolist()[:3] == [0, 0, -1.0]
    assert batch.scores.tolist() == [1.5, -1.0]


def test_transformed_scores_replace_the_total_on_the_final_token() -> None:
    batch = collate([two_turn_trajectory()], pad_token_id=0, scores=[3.0])
    assert batch.token_rewards[0].tolist() == [0, 0, 0, 0, 0.5, 0, 0, 0, 2.5]
    assert batch.token_rewards.sum().item() == pytest.approx(3.0)


def test_group_ids_follow_task_ids() -> None:
    trajectories = [one_turn_trajectory(t) for t in ["b", "a", "b", "c", "a"]]
    assert collate(trajectories, 0).group_ids.tolist() == [0, 1, 0, 2, 1]
    assert group_index(["x", "x"]) == [0, 0]


def test_select_trims_to_the_longest_selected_row() -> None:
    batch = collate([two_turn_trajectory(), one_turn_trajectory("t1")], pad_token_id=0)
    short = batch.select([1])
    assert short.input_ids.shape == (1, 3) and short.token_rewards.shape == (1, 3)
    assert short.scores.tolist() == [-1.0]


def test_collate_rejects_inconsistent_or_empty_trajectories() -> None:
    broken = two_turn_trajectory()
    broken.logprobs = broken.logprobs[:-1]
    with pytest.raises(ValueError, match="must match"):
        collate([broken], 0)
    empty = one_turn_trajectory("t")
    empty.token_roles = [P, P, P]
    with pytest.raises(ValueError, match="no policy tokens"):
        collate([empty], 0)
    with pytest.raises(ValueError, match="zero trajectories"):
        collate([], 0)


def test_minibatches_partition_the_batch() -> None:
    parts = minibatch_indices(10, 3, torch.Generator().manual_seed(0))
    assert sorted(torch.cat(parts).tolist()) == list(range(10)) and [len(p) for p in parts] == [4, 3, 3]
    assert [len(m) for m in micro_batches(parts[0], 3)] == [3, 1]
    with pytest.raises(ValueError):
        minibatch_indices(2, 3)
