"""Trajectory records round-trip through JSONL and refuse unknown schema versions."""

from __future__ import annotations

import json

import pytest

from rl_llm.types import Message, TokenRole, Trajectory, Turn


def make_trajectory() -> Trajectory:
    return Trajectory(
        env_id="rl-llm/TicTacToe-v0", task_id="t", seed=3,
        messages=[Message("system", "s"), Message("user", "u"), Message("assistant", "<move>B2</move>")],
        turns=[Turn(action="<move>B2</move>", observation="o", reward=0.5, token_start=2, token_end=4),
               Turn(action="x", observation="", reward=-1.0, invalid_action=True)],
        token_ids=[1, 2, 3, 4], token_roles=[TokenRole.PROMPT, TokenRole.PROMPT, TokenRole.POLICY, TokenRole.POLICY],
        logprobs=[0.0, 0.0, -0.1, -0.2], policy_version=2,
    )


def test_round_trip_preserves_every_field() -> None:
    trajectory = make_trajectory()
    restored = Trajectory.from_json(trajectory.to_json())
    assert restored == trajectory
    assert restored.total_reward == pytest.approx(-0.5)
    assert restored.num_policy_tokens == 2


def test_unknown_schema_version_is_refused() -> None:
    record = json.loads(make_trajectory().to_json())
    record["schema_version"] = 999
    with pytest.raises(ValueError, match="schema version 999"):
        Trajectory.from_json(json.dumps(record))
