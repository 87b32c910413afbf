"""`rl-llm view` shows both seats of a two-player match side by side (rl_llm/view.py)."""

from __future__ import annotations

import json
from pathlib import Path

from rl_llm.types import Trajectory, Turn
from rl_llm.view import load, render


def record(seat: str, opponent: str, group_index: int, reward: float) -> dict:
    trajectory = Trajectory(env_id="social/prisoners_dilemma_v0", task_id="t", seed=3, group_id="t|seed=3",
                            group_index=group_index, seat=seat, opponent=opponent,
                            turns=[Turn(action="<A>", observation="Round 1 result", reward=reward)])  # fmt: skip
    return {"step": 1, **json.loads(trajectory.to_json())}


def test_seats_of_a_match_are_paired_in_seat_order(tmp_path: Path) -> None:
    rows = [record("player_1", "self", 0, 5.0), record("player_0", "self", 0, 0.0), record("player_0", "always_defect", 1, 1.0),
            record("player_1", "policy", 1, 1.0)]  # fmt: skip
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    data = load(tmp_path, episodes=1)  # one episode chosen: its partner seat comes along
    assert len(data["episodes"]) == 1
    (match,) = data["episodes"]
    assert [view["seat"] for view in match["match"]] == ["player_0", "player_1"]
    assert [view["return"] for view in match["match"]] == [1.0, 1.0] and "vs" in match["label"]
    everything = load(tmp_path, episodes=24)["episodes"]
    assert [[view["opponent"] for view in entry["match"]] for entry in everything] == [["self", "self"], ["always_defect", "policy"]]
    assert 'class: "match"' in render(load(tmp_path))
