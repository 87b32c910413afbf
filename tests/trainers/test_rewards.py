"""The OTC transform over groups and PODS down-sampling, against hand-computed values and brute force."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl_llm.envs.wrappers.otc import otc_mapping
from rl_llm.trainers.rewards import OTCTransform, pods_max_variance, pods_select


def test_otc_transform_estimates_the_optimum_from_correct_group_members() -> None:
    otc = OTCTransform("grpo", alpha=1.0, c=1.0)
    out = otc([1.0, 1.0, 0.0, 0.0, 0.0], [2, 4, 1, 3, 0], ["a", "a", "a", "b", "b"])
    assert out == pytest.approx([1.0, math.sin(2 * math.pi / 3), 0.0, 0.0, 0.0])
    assert otc.state_dict() == {"a": 2}
    # the per-task history keeps the smallest count seen: later, a correct answer with 3 calls is past it
    assert otc([1.0], [3], ["a"]) == pytest.approx([math.sin(otc_mapping(3, 2) * math.pi / 4)])


def test_otc_transform_takes_the_envs_verdict_over_a_positive_reward() -> None:
    """A rollout rewarded (partial credit, say) but judged wrong by the env does not set the optimum."""
    otc = OTCTransform("grpo", alpha=1.0, c=1.0)
    out = otc([0.5, 1.0, 0.0], [1, 3, 0], ["a", "a", "a"], correct=[False, True, None])
    assert otc.state_dict() == {"a": 3}  # not 1: the one-call rollout was wrong
    assert out == pytest.approx([0.5 * math.sin(otc_mapping(1, 3) * math.pi / 6), 1.0, 0.0])
    # no verdict from the env: a positive reward counts as correct, as in the env wrapper
    otc([0.5], [2], ["a"], correct=[None])
    assert otc.state_dict() == {"a": 2}
    # a group where nothing is correct by the env's verdict and no history: left as is
    assert otc([0.7, 0.2], [1, 4], ["b", "b"], correct=[False, False]) == pytest.approx([0.7, 0.2])
    assert "b" not in otc.state_dict()


def test_otc_transform_state_round_trips() -> None:
    otc = OTCTransform("grpo")
    otc([1.0, 1.0], [2, 5], ["a", "b"])
    restored = OTCTransform("grpo")
    restored.load_state_dict(otc.state_dict())
    assert restored.state_dict() == {"a": 2, "b": 5}
    assert restored([1.0], [4], ["a"]) == otc([1.0], [4], ["a"])


def test_otc_ppo_variant_and_length_check() -> None:
    assert OTCTransform("ppo", alpha=2.0, c=1.0)([1.0, 0.5], [1, 0], ["a", "a"]) == pytest.approx([1.0, 1.0])
    with pytest.raises(ValueError, match="same length"):
        OTCTransform()([1.0], [1, 2], ["a"])


def test_pods_keeps_a_balanced_binary_subset() -> None:
    assert sorted(np.array([0, 0, 0, 1, 1, 0.5])[pods_max_variance([0, 0, 0, 1, 1, 0.5], 2)]) == [0, 1]
    assert sorted(np.array([0, 0, 0, 1, 1, 0])[pods_max_variance([0, 0, 0, 1, 1, 0], 4)]) == [0, 0, 1, 1]
    assert pods_max_variance([3, 1, 2], 3) == [0, 1, 2]
    with pytest.raises(ValueError, match="between 1 and 3"):
        pods_max_variance([1, 2, 3], 0)


@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=8), st.integers(1, 7))
def test_pods_matches_brute_force(rewards: list[float], keep: int) -> None:
    keep = min(keep, len(rewards))
    best = max(np.var([rewards[i] for i in combo]) for combo in itertools.combinations(range(len(rewards)), keep))
    chosen = pods_max_variance(rewards, keep)
    assert len(set(chosen)) == keep
    assert np.var([rewards[i] for i in chosen]) == pytest.approx(best, abs=1e-9)


def test_pods_select_works_per_group() -> None:
    chosen = pods_select([0, 1, 1, 1, 5, 5], ["a", "a", "a", "a", "b", "b"], keep=2)
    assert chosen[-2:] == [4, 5] and len(chosen) == 4 and 0 in chosen


@pytest.mark.parametrize("variant", ["grpo", "ppo"])
def test_otc_never_makes_a_wrong_answer_cheaper(variant: str) -> None:
    # Issue 15: a wrong answer (reward -1) with 6 calls scored -0.71, better than -0.87 with 1 call. Penalties
    # are not scaled by tool efficiency; only a positive task reward is (the paper's multiplicative form).
    otc = OTCTransform(variant, alpha=1.0, c=1.0)
    rewards = [1.0, -1.0, -1.0, 0.0, 1.0]
    calls = [1, 6, 1, 3, 4]
    out = otc(rewards, calls, ["a"] * 5, correct=[True, False, False, False, True])
    assert out[1] == out[2] == -1.0 and out[3] == 0.0
    assert out[0] >= out[4] and 0.0 < out[4] < 1.0  # more calls than needed: a smaller positive reward
    # Whatever the calls, a transformed reward is never above the untransformed one.
    for m in range(8):
        for reward in (-2.0, -0.5, 0.0, 0.3, 1.0):
            assert otc([1.0, reward], [1, m], ["b", "b"], correct=[True, None])[1] <= reward
