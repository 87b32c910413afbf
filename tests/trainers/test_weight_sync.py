"""InProcessSync's sleep/wake bookkeeping (vLLM colocate mode) on CPU, with a stand-in engine: a step that
ends without a push (PPO's critic warm-up) must not leave the engine asleep for the next rollout, and an
awake engine is never woken again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from rl_llm.trainers import generation as generation_module
from rl_llm.trainers import runner as runner_module
from rl_llm.trainers.config import load_config
from rl_llm.trainers.ppo import train_ppo
from rl_llm.trainers.sync import InProcessSync

QUIET = ["log.tensorboard=false", "log.progress=false", "log.plot=false"]


class StandInEngine:
    """Records the calls InProcessSync makes; refuses a sleep while asleep and a wake while awake."""

    def __init__(self, wrapped: Any = None) -> None:
        self.wrapped = wrapped
        self.calls: list[str] = []
        self.awake = self.weights_awake = True
        self._version = 0

    def sleep(self) -> None:
        assert self.awake, "sleep() on a sleeping engine"
        self.awake = self.weights_awake = False
        self.calls.append("sleep")

    def wake_up(self, tags: list[str] | None = None) -> None:
        assert not self.awake, "wake_up() on an awake engine"
        if tags == ["weights"]:  # split wake-up: the weights' memory first, then the KV cache
            self.weights_awake = True
            self.calls.append("wake weights")
            return
        self.awake = self.weights_awake = True
        self.calls.append("wake" if tags is None else "wake " + " ".join(tags))

    def load_weights(self, named: Any) -> None:
        assert self.awake or self.weights_awake, "load_weights() on a sleeping engine"
        list(named)
        self.calls.append("load")
        self.mark_updated()

    def mark_updated(self, version: int | None = None) -> None:
        if self.wrapped is not None:
            self.wrapped.mark_updated(version)
        else:
            self._version = self._version + 1 if version is None else version

    @property
    def policy_version(self) -> int:
        return self.wrapped.policy_version if self.wrapped is not None else self._version


def test_a_step_without_push_leaves_the_engine_awake_for_the_next_rollout() -> None:
    engine = StandInEngine()
    sync = InProcessSync(engine, sleep=True)
    model = nn.Linear(2, 2)
    # Warm-up step: collect, update (critic only), no push.
    sync.before_rollout()
    assert engine.awake
    sync.before_update()
    assert not engine.awake
    # Next step's rollout: the engine is woken first.
    sync.before_rollout()
    assert engine.awake
    sync.before_update()
    # A normal step: push wakes the sleeping engine, then loads.
    assert sync.push(model) == 1
    assert engine.awake
    sync.before_rollout()  # already awake: no second wake
    # A push on an awake engine (a resumed run) only loads.
    assert sync.push(model) == 2
    assert engine.calls == ["sleep", "wake", "sleep", "wake weights", "load", "wake kv_cache", "load"]


def test_without_sleep_mode_the_engine_is_never_slept_or_woken() -> None:
    engine = StandInEngine()
    sync = InProcessSync(engine, sleep=False)
    sync.before_rollout()
    sync.before_update()
    sync.before_rollout()
    sync.push(nn.Linear(2, 2))
    assert engine.calls == ["load"]


def test_every_rollout_of_a_ppo_run_with_critic_warmup_finds_the_engine_awake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """collect, the periodic eval and the final eval all run after warm-up steps that skip the push."""
    engines: list[StandInEngine] = []
    generations: list[tuple[str, bool]] = []

    def stand_in_sync(policy: Any, *args: Any, **kwargs: Any) -> InProcessSync:
        engines.append(StandInEngine(policy))
        return InProcessSync(engines[-1], sleep=True)

    def recording(name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            generations.append((name, engines[-1].awake))
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(generation_module, "make_weight_sync", stand_in_sync)
    # The step's rollouts (trainers/filtering.py collect_step, called by TrainingRun.collect).
    monkeypatch.setattr(runner_module, "collect_step", recording("collect", runner_module.collect_step))
    monkeypatch.setattr(runner_module, "evaluate_llm", recording("eval", runner_module.evaluate_llm))
    config = load_config(overrides=[
        "algorithm=ppo", "steps=3", "ppo.critic_warmup_steps=2", "eval.every=1", "eval.episodes=2",
        "eval.baselines=[]", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4",
        "env.kwargs={num_arms: 3, horizon: 1}", *QUIET,
    ])  # fmt: skip
    torch.manual_seed(0)
    train_ppo(config, tmp_path)
    (engine,) = engines
    assert [name for name, _ in generations] == ["eval", "collect", "eval", "collect", "eval", "collect", "eval"]
    assert all(awake for _, awake in generations), generations
    # Two warm-up steps without a push, then one push; the final eval needs no further wake.
    assert engine.calls == ["sleep", "wake", "sleep", "wake", "sleep", "wake weights", "load", "wake kv_cache"]


def test_the_old_make_weight_sync_still_builds_the_sync_with_a_warning() -> None:
    from rl_llm.trainers.sync import make_weight_sync

    with pytest.warns(DeprecationWarning, match="build_generation"):
        sync = make_weight_sync(StandInEngine(), "vllm", "colocate", False, None, 0, torch.device("cpu"))
    assert isinstance(sync, InProcessSync) and not sync.sleep
    assert sync.published_version == 0 and sync.push(nn.Linear(2, 2)) == sync.published_version == 1
