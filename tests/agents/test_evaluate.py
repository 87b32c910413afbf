"""``evaluate``: one entry point for LLM agents (rollout engine) and baselines, with records, JSONL and plot."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest

from rl_llm.agents import make_policy
from rl_llm.agents.evaluate import evaluate, plot_records, run_episodes, summarize, write_jsonl
from rl_llm.agents.rollout import read_trajectories


def test_llm_agents_are_evaluated_through_the_rollout_engine(make_tiny_policy, tmp_path: Path) -> None:
    seen = []
    records = evaluate("rl-llm/MultiArmedBandit-v0", make_tiny_policy(max_new_tokens=6), 5, seed=10,
                       env_kwargs={"horizon": 3}, batch_size=2, keep_transcripts=True, on_episode=seen.append,
                       trajectories_out=tmp_path / "t.jsonl")  # fmt: skip
    assert [r.episode for r in records] == [0, 1, 2, 3, 4] and [r.seed for r in records] == list(range(10, 15))
    assert sorted(r.seed for r in seen) == list(range(10, 15))
    trajectories = read_trajectories(tmp_path / "t.jsonl")
    for record, trajectory in zip(records, trajectories):
        assert record.turns == len(trajectory.turns) == 3 and (record.terminated or record.truncated)
        assert record.episode_return == trajectory.total_reward
        assert record.invalid_actions == sum(turn.invalid_action for turn in trajectory.turns)
        assert "regret" in record.metrics and record.error is None
        assert record.transcript.startswith("[system]\n") and "[assistant]" in record.transcript
        assert sum(record.reward_components.values()) == record.episode_return


def test_baselines_keep_the_lock_step_path_and_everything_plots(tmp_path: Path) -> None:
    env_id = "rl-llm/TicTacToe-v0"
    records = evaluate(env_id, make_policy("minimax", env_id, seed=0), 6, seed=0, env_kwargs={"opponent": "random"})
    assert len(records) == 6 and all(r.terminated and r.metrics["loss"] == 0.0 for r in records)
    summary = summarize(records)
    assert summary["return"][0] > 0
    plot = plot_records(records, tmp_path / "plots" / "minimax.png", title="minimax")
    assert plot.read_bytes().startswith(b"\x89PNG") and plot.stat().st_size > 10_000
    lines = write_jsonl(records, tmp_path / "m.jsonl", agent="minimax").read_text().splitlines()
    assert len(lines) == 6 and '"agent": "minimax"' in lines[0]


def test_envs_already_built_are_closed_when_another_cannot_be_built() -> None:
    closed: list[int] = []

    class Recorded(gym.Wrapper):
        def close(self) -> None:
            closed.append(id(self))
            super().close()

    built: list[gym.Env] = []

    def make_env() -> gym.Env:
        if len(built) == 2:
            raise RuntimeError("no sandbox left")
        built.append(Recorded(gym.make("rl-llm/TicTacToe-v0")))
        return built[-1]

    with pytest.raises(RuntimeError, match="no sandbox left"):
        run_episodes(make_env, make_policy("random", "rl-llm/TicTacToe-v0", seed=0), episodes=4, batch_size=4)
    assert sorted(closed) == sorted(id(env) for env in built)
