"""RecordTrajectories writes one replayable JSON line per finished episode."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym

import rl_llm  # noqa: F401
from rl_llm.agents.baselines import make_baseline
from rl_llm.agents.evaluate import evaluate
from rl_llm.envs.wrappers import RecordTrajectories

TTT = "rl-llm/TicTacToe-v0"


def test_each_finished_episode_is_one_line_that_replays_to_the_same_return(tmp_path: Path) -> None:
    path = tmp_path / "episodes.jsonl"
    records = evaluate(lambda: RecordTrajectories(gym.make(TTT), path, extra={"agent": "minimax"}),
                       make_baseline("minimax", TTT, seed=0), 5, seed=10, batch_size=2)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(line["seed"] for line in lines) == list(range(10, 15))
    by_seed = {record.seed: record for record in records}
    for line in lines:
        assert line["agent"] == "minimax" and line["env_id"] == TTT
        assert line["episode_return"] == by_seed[line["seed"]].total_reward
        replay = gym.make(TTT)
        observation, info = replay.reset(seed=line["seed"])
        assert observation == line["first_observation"] and info["task_id"] == line["task_id"]
        for step in line["steps"]:
            observation, reward, *_ = replay.step(step["action"])
            assert observation == step["observation"] and reward == step["reward"]


def test_an_unfinished_episode_is_not_written(tmp_path: Path) -> None:
    path = tmp_path / "episodes.jsonl"
    env = RecordTrajectories(gym.make(TTT, agent_mark="X"), path)
    env.reset(seed=0)
    env.step("<move>B2</move>")
    env.reset(seed=1)
    assert not path.exists() or path.read_text() == ""
