"""RayEnvPool on a local multi-process Ray cluster: same episodes as in-process envs, and actor failures."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from rl_llm.agents.baselines import make_baseline
from rl_llm.agents.evaluate import evaluate
from rl_llm.agents.policy import Completion, EpisodeAgent, EpisodeStart, Policy
from rl_llm.agents.ray_pool import EpisodeLost, RayEnvPool
from rl_llm.envs import EnvFactory
from rl_llm.types import Message, Trajectory

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'rl-llm[ray]'")

TTT = EnvFactory("rl-llm/TicTacToe-v0", opponent="mixed")
BANDIT = EnvFactory("rl-llm/MultiArmedBandit-v0", horizon=6)
HALF_CPU = {"num_cpus": 0.5}


@pytest.fixture(scope="module", autouse=True)
def local_cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def kill_and_wait(actor: Any) -> None:
    """Kill an actor and wait until it is really dead, so the next call on it fails. ``ray.kill`` is
    asynchronous: on a busy machine a call made just after it can still be answered."""
    ray.kill(actor)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ping.remote(), timeout=60)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    pytest.fail("the killed actor still answers after 60 s")


class KillWorkerOnce(Policy):
    """Delegates to ``policy``; the first time ``live`` episodes are in play at once, it kills the pool's first
    actor just before the next action: every env of the pool is then in the middle of an episode."""

    def __init__(self, policy: Policy, pool: RayEnvPool, live: int) -> None:
        self.policy, self.pool, self.live = policy, pool, live
        self.started = self.ended = 0
        self.killed = False

    def start_episode(self, episode: EpisodeStart) -> EpisodeAgent:
        self.started += 1
        return _KillOnce(self, self.policy.start_episode(episode))


class _KillOnce(EpisodeAgent):
    def __init__(self, killer: KillWorkerOnce, agent: EpisodeAgent) -> None:
        self.killer, self.agent = killer, agent

    def act(self, conversation: Sequence[Message]) -> str | Completion:
        killer = self.killer
        if not killer.killed and killer.started - killer.ended == killer.live:
            killer.killed = True
            kill_and_wait(killer.pool.actors[0])
        return self.agent.act(conversation)

    def end(self, trajectory: Trajectory) -> None:
        self.killer.ended += 1


def play(make_env: object, policy: Policy, episodes: int = 6) -> list[Trajectory]:
    return evaluate(make_env, policy, episodes, seed=11, batch_size=4)  # type: ignore[arg-type]


def test_ray_pool_reproduces_in_process_episodes_by_seed() -> None:
    with RayEnvPool(TTT, num_workers=2, resources_per_worker=HALF_CPU) as pool:
        remote = play(pool, make_baseline("random", TTT.env_id, seed=1))
        assert pool.stats.actor_restarts == 0
    local = play(TTT, make_baseline("random", TTT.env_id, seed=1))
    assert remote == local and all(t.error is None and t.turns for t in remote)


def test_killing_an_actor_mid_run_loses_no_episode() -> None:
    local = play(BANDIT, make_baseline("ucb", BANDIT.env_id, seed=2), episodes=8)
    with RayEnvPool(BANDIT, num_workers=2, resources_per_worker=HALF_CPU) as pool:
        first_actor = pool.actors[0]
        policy = KillWorkerOnce(make_baseline("ucb", BANDIT.env_id, seed=2), pool, live=4)
        remote = play(pool, policy, episodes=8)
        assert pool.stats.actor_restarts == 1 and pool.actors[0] is not first_actor
        assert pool.stats.episodes_replayed == 2  # the 4 envs in play are split over the two actors
        assert pool.stats.episodes_lost == 0
    assert [t.seed for t in remote] == list(range(11, 19))
    assert remote == local


def test_on_failure_raise_reports_the_lost_episode_and_the_env_stays_usable() -> None:
    with RayEnvPool(BANDIT, num_workers=1, resources_per_worker=HALF_CPU, on_failure="raise") as pool:
        env = pool()
        env.reset(seed=5)
        env.step("<action>A</action>")
        kill_and_wait(pool.actors[0])
        with pytest.raises(EpisodeLost) as lost:
            env.step("<action>B</action>")
        assert lost.value.seed == 5 and lost.value.turns == 1
        assert pool.stats.episodes_lost == 1 and pool.stats.actor_restarts == 1
        observation, _ = env.reset(seed=5)  # rebuilt on the replacement actor
        assert observation == BANDIT().reset(seed=5)[0]
        env.close()


def test_an_unseeded_episode_cannot_be_replayed_and_is_reported() -> None:
    with RayEnvPool(BANDIT, num_workers=1, resources_per_worker=HALF_CPU) as pool:
        env = pool()
        env.reset()
        kill_and_wait(pool.actors[0])
        with pytest.raises(EpisodeLost, match="unseeded"):
            env.step("<action>A</action>")


def test_env_errors_pass_through_unchanged_without_restarting_actors() -> None:
    with RayEnvPool(BANDIT, num_workers=1, resources_per_worker=HALF_CPU) as pool:
        env = pool()
        env.reset(seed=0, options={"means": [0.1, 0.2, 0.3, 0.4, 0.5]})
        with pytest.raises(ValueError, match="means"):
            env.reset(seed=0, options={"means": [2.0]})
        assert env.unwrapped.num_arms == 5  # attribute reads reach the remote env
        assert pool.stats.actor_restarts == 0


def test_pool_validates_its_arguments() -> None:
    with pytest.raises(ValueError, match="num_workers"):
        RayEnvPool(BANDIT, num_workers=0)
    with pytest.raises(ValueError, match="on_failure"):
        RayEnvPool(BANDIT, on_failure="ignore")
    # numpy counts and the smallest valid sizes are taken (the bad ones: tests/agents/test_argument_checks.py)
    import numpy as np

    with RayEnvPool(BANDIT, num_workers=np.int64(1), max_concurrency=1, call_timeout_s=60.0, max_restarts=0,
                    resources_per_worker=HALF_CPU) as pool:  # fmt: skip
        assert (pool.max_restarts, len(pool.actors)) == (0, 1)


# -- the rollout engine uses the pool as its env factory, unchanged ------------------------------------------
def _hf_policy(kill: tuple[RayEnvPool, int] | None = None) -> Any:
    pytest.importorskip("torch")
    from rl_llm.agents.hf import HFPolicy
    from rl_llm.agents.llm import SamplingParams
    from rl_llm.agents.tiny import tiny_model

    class KillingHFPolicy(HFPolicy):
        """The hf backend; on its ``kill_at``-th generate call it kills the pool's first actor."""

        calls = 0

        def generate(self, requests: Sequence[Any]) -> list[Completion]:
            self.calls += 1
            if kill is not None and self.calls == kill[1]:
                kill_and_wait(kill[0].actors[0])
            return super().generate(requests)

    return KillingHFPolicy(tiny_model(), sampling=SamplingParams(max_new_tokens=6, temperature=0.0))


def _collect(make_env: Any, policy: Any) -> list[Any]:
    from rl_llm.agents.rollout import collect

    return collect(make_env, policy, seeds=[3, 4], concurrency=1)


def _comparable(trajectories: list[Any]) -> list[tuple[Any, ...]]:
    return [(t.env_id, t.task_id, t.seed, t.token_ids, t.token_roles, [turn.reward for turn in t.turns], t.error)
            for t in trajectories]  # fmt: skip


def test_rollout_engine_on_the_pool_matches_in_process_envs_and_survives_a_kill() -> None:
    short_bandit = EnvFactory(BANDIT.env_id, horizon=4)
    local = _collect(short_bandit, _hf_policy())
    assert all(t.error is None and len(t.turns) == 4 for t in local)
    with RayEnvPool(short_bandit, num_workers=1, resources_per_worker=HALF_CPU) as pool:
        assert _comparable(_collect(pool, _hf_policy())) == _comparable(local)
        # kill the only actor in the middle of the second episode (before its turn 2 of 4)
        remote = _collect(pool, _hf_policy(kill=(pool, 6)))
        assert pool.stats.actor_restarts == 1 and pool.stats.episodes_replayed == 1
    assert _comparable(remote) == _comparable(local)
