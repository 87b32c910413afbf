"""Dynamic sampling (trainers/filtering.py): the gates, the refill loop and its bound, readmission; and, with the
tiny model, a filtered run that trains only on groups with signal, resumes exactly, and matches between the
synchronous loop and the asynchronous one at zero staleness."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_llm.trainers.cli import train_main
from rl_llm.trainers.config import ConfigError, load_config
from rl_llm.trainers.filtering import FilterConfig, fill_groups, group_passes
from rl_llm.trainers.logging import read_metrics
from rl_llm.types import TokenRole, Trajectory, Turn
from tests.trainers import longtail_env  # noqa: F401  (registers tests/LongTail-v0)

QUIET = ["log.tensorboard=false", "log.progress=false", "log.plot=false", "eval.baselines=[]"]
SMALL = ["steps=4", "eval.episodes=4", "rollout.group_size=4", "rollout.prompts_per_step=2", *QUIET]
FILTER = ["rollout.filter.zero_variance=true", "rollout.filter.max_extra_groups=4"]
TIMING = ("time/", "throughput/", "async/")


def test_zero_variance_drops_groups_whose_returns_are_all_equal() -> None:
    gate = FilterConfig(zero_variance=True)
    assert not group_passes([1.0, 1.0, 1.0], gate)
    assert group_passes([1.0, 1.0, 0.0], gate)
    assert not group_passes([1.0], gate)  # one usable episode: nothing to compare
    assert group_passes([1.0, 1.0], FilterConfig())  # no gate: everything passes


def test_the_advantage_range_gate_reads_centred_returns() -> None:
    gate = FilterConfig(advantage_range=0.1)
    assert not group_passes([1.0, 1.05, 0.95], gate)  # every |R - mean| <= 0.1 (GRPO would blow these up to +-1)
    assert group_passes([1.0, 1.0, 0.7], gate)  # |0.7 - 0.9| = 0.2 > 0.1
    assert not group_passes([2.0, 2.0], FilterConfig(advantage_range=0.0))  # r = 0 is the zero-variance gate


def group(seed: int, returns: list[float]) -> list[Trajectory]:
    out = []
    for g, reward in enumerate(returns):
        t = Trajectory(env_id="test", task_id=f"task{seed}", seed=seed, group_index=g)
        t.token_roles = [int(TokenRole.POLICY)]
        t.turns = [Turn(action="a", observation="", reward=reward)]
        out.append(t)
    return out


def stream(signal: set[int]):
    """A play function: groups of the seeds in ``signal`` get two different returns, the others equal ones; and a
    draw function handing out the next seeds. Both record what they were asked."""
    played: list[list[int]] = []
    state = {"next": 100}

    def play(seeds: list[int]) -> list[Trajectory]:
        played.append(list(seeds))
        return [t for s in seeds for t in group(s, [1.0, 0.0] if s in signal else [1.0, 1.0])]

    def draw(count: int) -> list[int]:
        start = state["next"]
        state["next"] += count
        return list(range(start, start + count))

    return play, draw, played


def test_dropped_groups_are_replaced_from_the_stream_until_enough_pass() -> None:
    play, draw, played = stream(signal={0, 2, 100, 102})
    trajectories, counts = fill_groups(play, draw, [0, 1, 2, 3], 4, FilterConfig(True, None, 8), min_episodes=1)
    # Round 1: 0 and 2 pass, 1 and 3 dropped -> draw 2 (100, 101): 100 passes -> draw 1 (102): passes.
    assert played == [[0, 1, 2, 3], [100, 101], [102]]
    assert sorted({t.seed for t in trajectories}) == [0, 2, 100, 102]
    assert (counts.drawn, counts.kept, counts.dropped, counts.readmitted, counts.rounds) == (7, 4, 3, 0, 3)
    assert counts.dropped_seeds == [1, 3, 101]


def test_the_refill_stops_at_the_bound_on_extra_groups() -> None:
    play, draw, played = stream(signal={0})
    trajectories, counts = fill_groups(play, draw, [0, 1], 2, FilterConfig(True, None, 3), min_episodes=1)
    assert played == [[0, 1], [100], [101], [102]]  # three replacement groups, none passes, then stop
    assert {t.seed for t in trajectories} == {0}
    assert (counts.drawn, counts.kept, counts.dropped) == (5, 1, 4)


def test_a_step_without_any_passing_group_readmits_enough_to_train_on() -> None:
    play, draw, _ = stream(signal=set())
    trajectories, counts = fill_groups(play, draw, [0, 1, 2], 3, FilterConfig(True, None, 0), min_episodes=3)
    assert [t.seed for t in trajectories] == [0, 0, 1, 1]  # two groups of 2 reach the 3 episodes minibatches need
    assert (counts.kept, counts.dropped, counts.readmitted) == (0, 3, 2)


@pytest.mark.parametrize("overrides, message", [
    (["rollout.filter.max_extra_groups=2"], "needs a gate"),
    (["rollout.filter.advantage_range=-1"], "advantage_range"),
    (["rollout.filter.zero_variance=true", "env.id=social/prisoners_dilemma_v0", "algorithm=rloo",
      "sft.episodes=0", "env.action_template=null", "env.kwargs={}"], "two-player"),
])  # fmt: skip
def test_bad_filter_settings_are_refused(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides)


def learning_figures(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in read_metrics(run_dir / "metrics.jsonl")]


def test_a_filtered_run_trains_only_on_groups_with_signal_resumes_exactly_and_runs_async(tmp_path: Path) -> None:
    assert train_main(None, [*SMALL, *FILTER], out=str(tmp_path / "whole")) == 0
    records = learning_figures(tmp_path / "whole")
    assert len(records) == 4
    for record in records:
        assert record["groups/drawn"] == record["groups/kept"] + record["groups/dropped"]
        assert record["groups/drawn"] <= 2 + 4  # prompts_per_step + max_extra_groups
        assert record["groups/kept"] <= 2
        if record["groups/readmitted"] == 0:
            assert record["groups/zero_std_frac"] == 0.0  # every trained group carries signal
    assert sum(r["groups/dropped"] for r in records) > 0, "the check needs a step that dropped a group"
    # Killed after step 2 (its checkpoint) and resumed: the same figures, so the same seeds were drawn.
    resumed = tmp_path / "resumed"
    assert train_main(None, [*SMALL, *FILTER, "steps=2", "log.checkpoint_every=1"], out=str(resumed)) == 0
    assert train_main(None, [*SMALL, *FILTER, "log.checkpoint_every=1"], out=str(resumed)) == 0
    assert learning_figures(resumed) == records
    state = json.loads(sorted((resumed / "checkpoints").glob("step_*/state.json"))[-1].read_text())  # step 4
    assert state["next_seed"] == sum(r["groups/drawn"] for r in records)  # dropped seeds consumed, none replayed
    # The asynchronous loop at zero staleness gates and refills on the generator side: the same figures.
    assert train_main(None, [*SMALL, *FILTER, "rollout.max_staleness=0"], out=str(tmp_path / "async")) == 0
    assert learning_figures(tmp_path / "async") == records


LONG_TAIL = ["env.id=tests/LongTail-v0", "env.kwargs={}", "env.action_template=null",
             "sft.episodes=0", "rollout.max_new_tokens=3", "rollout.group_size=2", "rollout.prompts_per_step=2",
             "rollout.partial_extra_groups=3", "eval.episodes=2", "log.checkpoint_every=1", *QUIET]  # fmt: skip


def test_partial_rollouts_refill_dropped_groups_and_the_ledger_consumes_them(tmp_path: Path) -> None:
    from rl_llm.trainers.async_rollouts import SeedLedger
    from rl_llm.trainers.checkpoint import Checkpointer

    overrides = [*LONG_TAIL, "steps=4", "rollout.max_staleness=1", "rollout.partial_rollouts=true",
                 "rollout.filter.advantage_range=0.2", "rollout.filter.max_extra_groups=3"]  # fmt: skip
    assert train_main(None, overrides, out=str(tmp_path)) == 0
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert len(records) == 4
    for r in records:
        assert r["async/groups"] == r["groups/drawn"] == r["groups/kept"] + r["groups/dropped"]
        assert r["episode/trained"] + r["async/dropped_stale"] == 2 * (r["groups/kept"] + r["groups/readmitted"])
    assert sum(r["groups/dropped"] for r in records) > 0, "the check needs a step that dropped a group"
    _, state = Checkpointer(tmp_path / "checkpoints").load(tmp_path / "checkpoints" / "step_000004")
    ledger = SeedLedger(state["next_seed"], state["pending_seeds"])
    # Dropped groups are consumed like kept ones: every seed below next_seed was consumed once or is pending.
    assert sum(int(r["groups/drawn"]) for r in records) == ledger.next_seed - len(ledger.pending)
