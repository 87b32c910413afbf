"""``evaluate``: one entry point for every agent (LLMs and baselines, all through the rollout engine), with
trajectories, per-episode JSONL and a plot; env errors recorded per episode; ``run_episodes`` deprecated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from rl_llm.agents import make_policy
from rl_llm.agents.baselines import make_baseline
from rl_llm.agents.evaluate import evaluate, plot_records, summarize, write_jsonl
from rl_llm.agents.rollout import read_trajectories
from rl_llm.envs.base import Outcome, Task, TextEnv

TTT = "rl-llm/TicTacToe-v0"


def test_llm_agents_are_evaluated_through_the_rollout_engine(make_tiny_policy, tmp_path: Path) -> None:
    seen = []
    trajectories = evaluate("rl-llm/MultiArmedBandit-v0", make_tiny_policy(max_new_tokens=6), 5, seed=10,
                            env_kwargs={"horizon": 3}, batch_size=2, on_episode=seen.append,
                            trajectories_out=tmp_path / "t.jsonl")  # fmt: skip
    assert [t.seed for t in trajectories] == list(range(10, 15))
    assert sorted(t.seed for t in seen) == list(range(10, 15))
    assert read_trajectories(tmp_path / "t.jsonl") == trajectories
    rows = [json.loads(line) for line in write_jsonl(trajectories, tmp_path / "rows.jsonl").read_text().splitlines()]
    for index, (row, trajectory) in enumerate(zip(rows, trajectories, strict=True)):
        assert row["episode"] == index and row["seed"] == trajectory.seed
        assert row["turns"] == len(trajectory.turns) == 3 and (row["terminated"] or row["truncated"])
        assert row["episode_return"] == trajectory.total_reward and trajectory.num_policy_tokens > 0
        assert row["invalid_actions"] == sum(turn.invalid_action for turn in trajectory.turns)
        assert "regret" in row["metrics"] and row["error"] is None
        assert sum(row["reward_components"].values()) == pytest.approx(row["episode_return"])


def test_baselines_play_through_the_engine_and_everything_plots(tmp_path: Path) -> None:
    trajectories = evaluate(TTT, make_policy("minimax", TTT, seed=0), 6, seed=0, env_kwargs={"opponent": "random"},
                            trajectories_out=tmp_path / "minimax.trajectories.jsonl")  # fmt: skip
    assert len(trajectories) == 6 and all(t.terminated and t.metrics["loss"] == 0.0 for t in trajectories)
    # A baseline's trajectory: messages, turns and rewards, and no tokens (it generates none).
    for trajectory in trajectories:
        assert [m.role for m in trajectory.messages[:2]] == ["system", "user"] and trajectory.end_reason == "terminated"
        assert len(trajectory.messages) == 2 * len(trajectory.turns) + 1  # no observation after the last move
        assert not trajectory.token_ids and trajectory.turns[0].action.startswith("<move>")
    assert read_trajectories(tmp_path / "minimax.trajectories.jsonl") == trajectories
    summary = summarize(trajectories)
    assert summary["return"][0] > 0
    plot = plot_records(trajectories, tmp_path / "plots" / "minimax.png", title="minimax")
    assert plot.read_bytes().startswith(b"\x89PNG") and plot.stat().st_size > 10_000
    lines = write_jsonl(trajectories, tmp_path / "m.jsonl", agent="minimax").read_text().splitlines()
    assert len(lines) == 6 and '"agent": "minimax"' in lines[0]


def test_a_baseline_episode_depends_on_its_seed_alone_not_on_the_batch() -> None:
    bandit = "rl-llm/MultiArmedBandit-v0"
    one_by_one = evaluate(bandit, make_baseline("thompson", bandit, seed=3), 6, seed=20, batch_size=1)
    together = evaluate(bandit, make_baseline("thompson", bandit, seed=3), 6, seed=20, batch_size=6)
    later = evaluate(bandit, make_baseline("thompson", bandit, seed=3), 3, seed=23, batch_size=3)
    assert [t.messages for t in one_by_one] == [t.messages for t in together]
    assert [t.messages for t in later] == [t.messages for t in one_by_one[3:]]
    other_seed = evaluate(bandit, make_baseline("thompson", bandit, seed=4), 6, seed=20)
    assert [t.messages for t in other_seed] != [t.messages for t in one_by_one]


def test_oracles_keep_each_episode_apart_however_many_run_at_once() -> None:
    # The oracle reads each episode's own env; with many episodes in flight none takes another's answer.
    for env_id in ("rl-llm/MultiArmedBandit-v0", "rl-llm/TextToSQL-v0", "rl-llm/Search-v0"):
        trajectories = evaluate(env_id, make_baseline("oracle", env_id), 8, seed=0, batch_size=8)
        assert all(t.error is None for t in trajectories), env_id
        if env_id != "rl-llm/MultiArmedBandit-v0":
            assert [t.total_reward for t in trajectories] == [1.0] * 8, env_id
        else:
            assert all(t.metrics["regret"] == pytest.approx(0.0, abs=1e-9) for t in trajectories)


class FailingEnv(TextEnv):
    """Two turns an episode; seed 2's second step raises (a crashed tool, a lost sandbox)."""

    def __init__(self) -> None:
        super().__init__(max_turns=5)

    def _reset(self, options: dict[str, Any]) -> Task:
        return Task(observation="Say anything.", task_id=f"task-{self.seed}", system_prompt="Play.")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        self.seed = seed
        return super().reset(seed=seed, options=options)

    def _step(self, action: str) -> Outcome:
        if self.seed == 2 and self.turn == 2:
            raise RuntimeError("tool crashed")
        return Outcome("Again.", {"step": 1.0}, terminated=self.turn >= 2)


def test_an_env_error_is_recorded_on_its_episode_and_the_others_go_on(tmp_path: Path) -> None:
    from rl_llm.agents.policy import TextPolicy

    class Echo(TextPolicy):
        def respond(self, conversation: list) -> str:
            return "hello"

    trajectories = evaluate(FailingEnv, Echo(), 5, seed=0, batch_size=2, trajectories_out=tmp_path / "t.jsonl")
    failed = [t for t in trajectories if t.error]
    assert [t.seed for t in failed] == [2] and failed[0].end_reason == "error"
    assert "env.step failed: RuntimeError: tool crashed" in failed[0].error and len(failed[0].turns) == 1
    assert all(t.total_reward == 2.0 and t.terminated for t in trajectories if t.seed != 2)
    assert len(read_trajectories(tmp_path / "t.jsonl")) == 5


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
        built.append(Recorded(gym.make(TTT)))
        return built[-1]

    with pytest.raises(RuntimeError, match="no sandbox left"):
        evaluate(make_env, make_policy("random", TTT, seed=0), episodes=4, batch_size=4)
    assert sorted(closed) == sorted(id(env) for env in built)


def test_run_episodes_and_episode_record_still_work_with_a_deprecation_warning() -> None:
    import rl_llm.agents.evaluate as module

    with pytest.warns(DeprecationWarning, match="run_episodes is deprecated"):
        records = module.run_episodes(lambda: gym.make(TTT), make_baseline("minimax", TTT, seed=0), 3, seed=5,
                                      keep_transcripts=True)  # fmt: skip
    with pytest.warns(DeprecationWarning, match="EpisodeRecord is deprecated"):
        record_type = module.EpisodeRecord
    assert [type(r) for r in records] == [record_type] * 3 and [r.episode for r in records] == [0, 1, 2]
    assert [r.seed for r in records] == [5, 6, 7] and all(r.metrics["loss"] == 0.0 for r in records)
    assert records[0].transcript.startswith("[system]\n") and summarize(records)["turns"][0] >= 3
