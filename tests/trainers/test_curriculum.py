"""Curricula (trainers/curriculum.py): levels promoted and demoted by the running success rate, easy/normal/hard
pools by per-task running reward, envs built per level, draws that depend only on seeds and state; and, with the
tiny model, a curriculum run that logs its level mix and resumes exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_llm.trainers.cli import train_main
from rl_llm.trainers.config import ConfigError, load_config
from rl_llm.trainers.curriculum import LEVEL_OPTION, TaskSampler, train_env_factory
from rl_llm.trainers.logging import read_metrics
from rl_llm.trainers.runner import env_factory
from rl_llm.types import Trajectory, Turn

TICTACTOE = ["env.id=rl-llm/TicTacToe-v0", "env.kwargs={opponent: mixed, opponent_skill: 1.0}",
             "env.action_template=null", "sft.episodes=0"]  # fmt: skip
LEVELS = [*TICTACTOE, "curriculum.kind=levels", "curriculum.option=opponent_skill", "curriculum.levels=[0.0, 0.5, 1.0]",
          "curriculum.window=4", "curriculum.success_metric=win"]  # fmt: skip


def played(seed: int, wins: list[float], reward: float = 0.0, error: str | None = None) -> list[Trajectory]:
    return [Trajectory(env_id="t", task_id=f"task{seed}", seed=seed, group_index=g, metrics={"win": w},
                       turns=[Turn(action="a", observation="", reward=reward)], error=error)
            for g, w in enumerate(wins)]  # fmt: skip


def test_levels_go_up_on_success_and_down_on_failure() -> None:
    sampler = TaskSampler(load_config(overrides=LEVELS))
    assert sampler.options_for(0) == {LEVEL_OPTION: 0.0}
    assert sampler.options_for(0) == {LEVEL_OPTION: 0.0}  # a seed keeps its draw until observed
    sampler.observe(played(0, [1.0, 1.0, 1.0]))  # 3 of the window's 4 episodes
    assert sampler.level == 0
    sampler.options_for(1)
    sampler.observe(played(1, [1.0, 0.0]))  # window full: 4/5 = 0.8 >= 0.7
    assert sampler.level == 1 and sampler.window == []
    assert sampler.options_for(2) == {LEVEL_OPTION: 0.5}
    assert sampler.step_metrics() == {"curriculum/level_0_frac": 2 / 3, "curriculum/level_1_frac": 1 / 3,
                                      "curriculum/level_2_frac": 0.0, "curriculum/level": 1.0}  # fmt: skip
    sampler.observe(played(2, [0.0, 0.0, 0.0, 0.0]))  # 0.0 <= 0.1: back down
    assert sampler.level == 0
    sampler.options_for(3)
    sampler.observe(played(3, [0.0, 1.0, 0.0, 0.0]))  # 0.25: between the thresholds, stays
    assert sampler.level == 0


def test_a_group_not_drawn_at_the_current_level_does_not_move_it() -> None:
    sampler = TaskSampler(load_config(overrides=LEVELS))
    sampler.observe(played(5, [1.0] * 8))  # never drawn: nothing known about its level
    assert sampler.level == 0 and sampler.window == []


def test_draws_depend_only_on_the_run_seed_the_group_seed_and_the_state() -> None:
    config = load_config(overrides=[*LEVELS, "curriculum.start=2", "curriculum.review_frac=0.5"])
    first, second = TaskSampler(config), TaskSampler(config)
    draws = [first.options_for(seed)[LEVEL_OPTION] for seed in range(200)]
    assert draws == [second.options_for(seed)[LEVEL_OPTION] for seed in reversed(range(200))][::-1]
    share = sum(d < 1.0 for d in draws) / len(draws)
    assert 0.35 < share < 0.65 and set(draws) == {0.0, 0.5, 1.0}  # about half reviewed, at both lower levels
    other = TaskSampler(load_config(overrides=[*LEVELS, "curriculum.start=2", "curriculum.review_frac=0.5", "seed=1"]))
    assert [other.options_for(seed)[LEVEL_OPTION] for seed in range(200)] != draws


def test_the_sampler_state_survives_a_checkpoint() -> None:
    config = load_config(overrides=LEVELS)
    sampler = TaskSampler(config)
    for seed, wins in enumerate([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]):
        sampler.options_for(seed)
        sampler.observe(played(seed, wins))  # promoted once the window holds 6 >= 4 episodes; then 3 more
    restored = TaskSampler(config)
    restored.load_state_dict(sampler.state_dict())
    assert (restored.level, restored.window) == (1, [True, True, False])
    assert restored.options_for(9) == sampler.options_for(9)


SQL = ["env.id=rl-llm/TextToSQL-v0"]  # an env with a task set (reset option task_index), as pools need
POOLS = [*SQL, "curriculum.kind=pools", "curriculum.num_tasks=6", "curriculum.ema=1.0"]


def test_pools_sort_tasks_by_running_reward_and_draw_by_pool_weight() -> None:
    sampler = TaskSampler(load_config(overrides=[*POOLS, "curriculum.pool_weights={hard: 1.0}"]))
    assert sampler.pools()["normal"] == list(range(6))  # nothing played yet: all normal
    tasks = {}
    for seed in range(20):  # with only the normal pool filled, the hard weight has no pool: draws from all
        tasks[seed] = sampler.options_for(seed)["task_index"]
    assert set(tasks.values()) <= set(range(6))
    rewards = {0: 1.0, 1: 0.9, 2: 0.5, 3: 0.0, 4: 0.1}  # task 5 never played
    for seed in range(20):
        sampler.observe(played(seed, [0.0, 0.0], reward=rewards.get(tasks[seed], 0.5)))
    pools = sampler.pools()
    played_tasks = set(tasks.values())
    assert set(pools["easy"]) == {0, 1} & played_tasks and set(pools["hard"]) == {3, 4} & played_tasks
    hard_draws = {sampler.options_for(seed)["task_index"] for seed in range(100, 140)}
    assert hard_draws == set(pools["hard"])  # weight only on hard: every draw is a hard task
    metrics = sampler.step_metrics()
    assert metrics["curriculum/hard_frac"] == 40 / 60 and metrics["curriculum/easy_tasks"] == len(pools["easy"])


def test_the_running_reward_is_an_exponential_average() -> None:
    sampler = TaskSampler(load_config(overrides=[*SQL, "curriculum.kind=pools", "curriculum.num_tasks=1",
                                                 "curriculum.ema=0.25"]))  # fmt: skip
    for seed, reward in enumerate([1.0, 0.0]):
        sampler.options_for(seed)
        sampler.observe(played(seed, [0.0], reward=reward))
    assert sampler.running == {0: 0.75}  # 1.0, then 0.75 * 1.0 + 0.25 * 0.0


def test_each_level_plays_its_own_env() -> None:
    config = load_config(overrides=LEVELS)
    env = train_env_factory(config, env_factory(config))()
    _, info = env.reset(seed=3, options={LEVEL_OPTION: 0.0})
    assert env.unwrapped.opponent_skill == 0.0 and "mixed0-" in info["task_id"]
    first = env.unwrapped
    _, info = env.reset(seed=3, options={LEVEL_OPTION: 1.0})
    assert env.unwrapped.opponent_skill == 1.0 and "mixed1-" in info["task_id"]
    env.reset(seed=3, options={LEVEL_OPTION: 0.0})
    assert env.unwrapped is first  # built once per level, then reused
    with pytest.raises(ValueError, match="takes no reset option 'bogus'"):  # refused by the level-1 env
        env.reset(seed=4, options={LEVEL_OPTION: 1.0, "bogus": 1})
    assert env.unwrapped is first and env.step("<move>B2</move>")[4]["turn"] == 1  # level 0's episode goes on
    env.close()
    plain = load_config(overrides=TICTACTOE)
    make = env_factory(plain)
    assert train_env_factory(plain, make) is make  # no curriculum: training plays evaluation's env


@pytest.mark.parametrize("overrides, message", [
    ([*TICTACTOE, "curriculum.kind=levels"], "curriculum.option"),
    ([*LEVELS, "curriculum.kind=ladder"], "curriculum.kind"),
    ([*LEVELS, "curriculum.promote_at=0.05"], "demote_at < promote_at"),
    ([*LEVELS, "rollout.max_staleness=0"], "asynchronous"),
    ([*LEVELS, "curriculum.start=3"], "curriculum.start"),
    ([*POOLS, "curriculum.pool_weights={trivial: 1.0}"], "pool_weights"),
    # the option a curriculum sets must be one the env reads: else every level or pool is the same episode
    ([*TICTACTOE, "curriculum.kind=pools"], r"picks tasks by the reset option 'task_index', which "
                                            r"rl-llm/TicTacToe-v0 does not read; its reset options are agent_mark$"),
    ([*TICTACTOE, "curriculum.kind=levels", "curriculum.via=reset", "curriculum.option=opponent_skil",
      "curriculum.levels=[0.0, 1.0]"], r"curriculum.option is the reset option 'opponent_skil', which .* "
                                       r"\(curriculum.via=kwargs sets a constructor argument\)"),
])  # fmt: skip
def test_bad_curriculum_settings_are_refused(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides)


QUIET = ["log.tensorboard=false", "log.progress=false", "log.plot=false", "eval.baselines=[]"]
# The default job's bandit with the horizon as the level: 1, 2 or 4 pulls; success is a positive return.
BANDIT_LEVELS = ["steps=4", "eval.episodes=4", "rollout.group_size=4", "rollout.prompts_per_step=2", *QUIET,
                 "curriculum.kind=levels", "curriculum.option=horizon", "curriculum.levels=[1, 2, 4]",
                 "curriculum.window=8", "curriculum.promote_at=0.5", "curriculum.review_frac=0.3"]  # fmt: skip


def test_a_curriculum_run_logs_its_level_mix_and_resumes_exactly(tmp_path: Path) -> None:
    def figures(run: Path) -> list[dict]:
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))}
                for r in read_metrics(run / "metrics.jsonl")]  # fmt: skip

    assert train_main(None, BANDIT_LEVELS, out=str(tmp_path / "whole")) == 0
    records = figures(tmp_path / "whole")
    for record in records:
        mix = [record[f"curriculum/level_{i}_frac"] for i in range(3)]
        assert sum(mix) == pytest.approx(1.0) and record["curriculum/level"] in (0.0, 1.0, 2.0)
    assert records[-1]["curriculum/level"] > 0, "the tiny model wins most pulls of the warm-started bandit"
    resumed = tmp_path / "resumed"
    assert train_main(None, [*BANDIT_LEVELS, "steps=2", "log.checkpoint_every=1"], out=str(resumed)) == 0
    assert train_main(None, [*BANDIT_LEVELS, "log.checkpoint_every=1"], out=str(resumed)) == 0
    assert figures(resumed) == records
