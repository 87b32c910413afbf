"""The hf backend with the tiny local model, through the rollout engine, on every registered environment."""

from __future__ import annotations

import asyncio
import functools
import threading
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch

from rl_llm.agents import make_policy
from rl_llm.agents.aio import run_sync
from rl_llm.agents.llm import GenerationRequest, first_stop
from rl_llm.agents.policy import EpisodeStart
from rl_llm.agents.rollout import EpisodeJob, RolloutEngine, collect, read_trajectories, write_trajectories
from rl_llm.envs.base import Outcome, Task, TextEnv
from rl_llm.envs.registration import env_ids
from rl_llm.types import TRAJECTORY_SCHEMA_VERSION, Message, TokenRole
from tests.agents.trajectory_checks import assert_logprobs_match_forward_pass, assert_token_bookkeeping
from tests.envs.test_registered_envs import TEST_KWARGS

MAX_TURNS_IN_TESTS = 3


def short_env(env_id: str) -> gym.Env:
    """The env with its test arguments, cut at a few turns so a random model finishes quickly."""
    return gym.make(env_id, max_episode_steps=MAX_TURNS_IN_TESTS, **TEST_KWARGS.get(env_id, {}))


@pytest.mark.parametrize("env_id", env_ids())
def test_tiny_model_plays_every_env_to_the_end_token_in_token_out(env_id: str, make_tiny_policy) -> None:
    policy = make_tiny_policy(temperature=0.7, max_new_tokens=12)
    trajectories = collect(functools.partial(short_env, env_id), policy, seeds=[5, 6], group_size=2, concurrency=4)
    assert len(trajectories) == 4
    for trajectory in trajectories:
        assert trajectory.error is None
        assert trajectory.terminated or trajectory.truncated
        assert trajectory.end_reason in ("terminated", "truncated")
        assert 1 <= len(trajectory.turns) <= MAX_TURNS_IN_TESTS
        assert trajectory.turns[-1].observation == "" or trajectory.truncated
        assert trajectory.temperature == pytest.approx(0.7)
        assert_token_bookkeeping(trajectory, policy)
        assert_logprobs_match_forward_pass(trajectory, policy.model)
    # Group semantics: the same seed gives the same task and group id; different seeds different groups.
    assert [t.seed for t in trajectories] == [5, 5, 6, 6]
    assert [t.group_index for t in trajectories] == [0, 1, 0, 1]
    assert trajectories[0].group_id == trajectories[1].group_id != trajectories[2].group_id
    assert trajectories[0].task_id == trajectories[1].task_id


def test_log_probs_follow_the_temperature_and_greedy_uses_plain_log_probs(make_tiny_policy) -> None:
    greedy = make_tiny_policy(temperature=0.0, max_new_tokens=10)
    first, second = collect("rl-llm/TicTacToe-v0", greedy, seeds=[1], group_size=2)
    assert first.temperature == 1.0
    assert first.token_ids == second.token_ids, "greedy decoding of the same task is deterministic"
    assert_logprobs_match_forward_pass(first, greedy.model)
    hot = make_tiny_policy(temperature=1.7, max_new_tokens=10)
    trajectory = collect("rl-llm/TicTacToe-v0", hot, seeds=[1])[0]
    assert_logprobs_match_forward_pass(trajectory, hot.model)
    with pytest.raises(AssertionError, match="differ"):  # the check itself can fail: T=1 is not T=1.7
        trajectory.temperature = 1.0
        assert_logprobs_match_forward_pass(trajectory, hot.model)


def test_generation_stops_at_the_first_stop_string_and_keeps_it(make_tiny_policy) -> None:
    policy = make_tiny_policy(temperature=1.0, max_new_tokens=40)
    conversation = [Message("system", "Play."), Message("user", "Your move?")]
    stops = ("e", "a")  # frequent characters, so most rows stop early
    completions = policy.generate([GenerationRequest(conversation, stop=stops) for _ in range(12)])
    stopped = [c for c in completions if c.finish_reason == "stop"]
    assert stopped, "with such common stop strings some rows must stop"
    for completion in completions:
        assert policy.decode(completion.token_ids) == completion.text
        assert len(completion.token_ids) == len(completion.logprobs) <= 40
        before_last = policy.decode(completion.token_ids[:-1])
        assert first_stop(before_last, stops) < 0, "generation went on past a stop string"
        if completion.finish_reason == "stop" and completion.token_ids[-1] not in policy.eos_ids:
            assert first_stop(completion.text, stops) >= 0
        if completion.finish_reason == "length":
            assert len(completion.token_ids) == 40


def test_the_model_generation_config_does_not_reshape_the_sampling_distribution(make_tiny_policy) -> None:
    policy = make_tiny_policy(temperature=0.0, max_new_tokens=24)
    policy.model.generation_config.repetition_penalty = 50.0  # real models ship such defaults (Qwen2.5: 1.05)
    conversation = [Message("system", "Play."), Message("user", "Your move?")]
    (completion,) = policy.generate([GenerationRequest(conversation)])
    prompt = policy.chat_format.prompt_ids(conversation)
    with torch.no_grad():
        logits = policy.model(torch.tensor([prompt + completion.token_ids])).logits[0]
    greedy = logits[len(prompt) - 1 : -1].argmax(dim=-1).tolist()
    assert completion.token_ids == greedy, "greedy decoding must follow the raw logits the log-probs come from"


class GatedEnv(TextEnv):
    """A test env: ends after ``options["turns"]`` turns; a step waits for ``options["gate"]`` if given."""

    stop = ("</action>",)

    def __init__(self) -> None:
        super().__init__(max_turns=100)

    def _reset(self, options: dict[str, Any]) -> Task:
        self.turns, self.gate, self.fail_on = options["turns"], options.get("gate"), options.get("fail_on")
        return Task(observation="Turn 0.", task_id=f"gated-{self.turns}", system_prompt="Say anything.")

    def _step(self, action: str) -> Outcome:
        if self.gate is not None and not self.gate.wait(timeout=60):
            raise RuntimeError("the gate never opened: the other episodes waited for this one")
        if self.fail_on == self.turn:
            raise RuntimeError("tool crashed")
        done = self.turn >= self.turns
        return Outcome(f"Turn {self.turn}.", {"step": 1.0}, terminated=done, metrics={"chars": float(len(action))})


def test_an_episode_blocked_in_its_env_step_does_not_hold_the_others_up(make_tiny_policy) -> None:
    policy = make_tiny_policy(max_new_tokens=4)
    gate = threading.Event()
    fast_jobs = [EpisodeJob(seed=i, options={"turns": 4}) for i in (1, 2, 3)]
    jobs = [EpisodeJob(seed=0, options={"turns": 1, "gate": gate}), *fast_jobs]
    finished: list[int] = []

    def on_trajectory(trajectory) -> None:
        finished.append(trajectory.seed)
        if len(finished) == len(fast_jobs):
            gate.set()  # only now may the slow episode's step return

    engine = RolloutEngine(policy, GatedEnv, concurrency=4)
    trajectories = engine.run(jobs, on_trajectory)
    assert [t.error for t in trajectories] == [None] * 4
    assert finished[-1] == 0 and sorted(finished[:3]) == [1, 2, 3]
    assert [len(t.turns) for t in trajectories] == [1, 4, 4, 4]
    assert engine.stats.policy_tokens == sum(t.num_policy_tokens for t in trajectories)


def test_a_failing_env_ends_only_its_own_episode_with_the_reason(make_tiny_policy) -> None:
    policy = make_tiny_policy(max_new_tokens=4)
    jobs = [EpisodeJob(seed=0, options={"turns": 3, "fail_on": 2}),
            EpisodeJob(seed=1, options={"turns": 3})]  # fmt: skip
    broken, healthy = RolloutEngine(policy, GatedEnv, concurrency=2).run(jobs)
    assert broken.end_reason == "error" and "env.step failed: RuntimeError: tool crashed" in broken.error
    assert len(broken.turns) == 1 and broken.truncated
    assert healthy.error is None and len(healthy.turns) == 3 and healthy.terminated


class HandoffEnv(TextEnv):
    """A test env for two episodes: the "second" one is inside its env step when the "first" one ends."""

    def __init__(self) -> None:
        super().__init__(max_turns=100)

    def _reset(self, options: dict[str, Any]) -> Task:
        self.options = options
        return Task(observation="Turn 0.", task_id=options["role"], system_prompt="Say anything.")

    def _step(self, action: str) -> Outcome:
        events = self.options
        if events["role"] == "first":
            events["second_is_stepping"].wait(timeout=60)
            return Outcome("", {"step": 1.0}, terminated=True)
        events["second_is_stepping"].set()
        events["release"].wait(timeout=60)
        return Outcome("Again.", {"step": 1.0})


def test_an_exception_in_one_episode_stops_the_others_too(make_tiny_policy) -> None:
    events = {"second_is_stepping": threading.Event(), "release": threading.Event()}
    jobs = [EpisodeJob(seed=0, options={"role": "first", **events}),
            EpisodeJob(seed=1, options={"role": "second", **events})]  # fmt: skip

    def on_trajectory(trajectory) -> None:
        events["release"].set()  # the second episode's step returns, and it would go on playing
        raise RuntimeError("callback failed")

    with pytest.raises(RuntimeError, match="callback failed"):
        RolloutEngine(make_tiny_policy(max_new_tokens=3), HandoffEnv, concurrency=2).run(jobs, on_trajectory)

    async def running_episodes() -> list[asyncio.Task]:
        return [task for task in asyncio.all_tasks() if "RolloutEngine._episode" in repr(task.get_coro())]

    assert run_sync(running_episodes()) == [], "an episode outlived the rollout (and waits forever on its scheduler)"


def test_the_context_limit_ends_an_episode_as_truncated(make_tiny_policy) -> None:
    policy = make_tiny_policy(max_new_tokens=8)
    prompt_length = len(policy.chat_format.prompt_ids([Message("system", "Say anything."), Message("user", "Turn 0.")]))
    engine = RolloutEngine(policy, GatedEnv, max_context_tokens=prompt_length + 30)
    (trajectory,) = engine.run([EpisodeJob(seed=0, options={"turns": 50})])
    assert trajectory.end_reason == "context_limit" and trajectory.truncated and trajectory.error is None
    assert len(trajectory.token_ids) <= prompt_length + 30
    assert_token_bookkeeping(trajectory, policy)


def test_close_leaves_no_thread_of_the_policy_behind(make_tiny_policy) -> None:
    before = set(threading.enumerate())
    policy = make_tiny_policy(max_new_tokens=3)
    collect("rl-llm/TicTacToe-v0", policy, seeds=[0, 1])
    generating = [t for t in set(threading.enumerate()) - before if t.name.startswith("rl-llm-generate")]
    assert generating, "batch generation runs on the policy's own thread"
    policy.close()
    assert not [t for t in generating if t.is_alive()]


def test_trajectories_round_trip_through_jsonl(make_tiny_policy, tmp_path: Path) -> None:
    policy = make_tiny_policy(max_new_tokens=6)
    trajectories = collect("rl-llm/MultiArmedBandit-v0", policy, seeds=[0, 1], env_kwargs={"horizon": 3})
    path = write_trajectories(trajectories, tmp_path / "t.jsonl")
    assert f'"schema_version": {TRAJECTORY_SCHEMA_VERSION}' in path.read_text().splitlines()[0]
    assert read_trajectories(path) == trajectories
    assert all(t.metrics and "regret" in t.metrics for t in trajectories)


def test_new_weights_change_generation_and_the_recorded_policy_version(make_tiny_policy) -> None:
    policy = make_tiny_policy(temperature=0.0, max_new_tokens=8)
    before = collect("rl-llm/TicTacToe-v0", policy, seeds=[2])[0]
    embedding = policy.model.get_input_embeddings().weight
    generator = torch.Generator().manual_seed(1)
    policy.load_weights([("model.embed_tokens.weight", torch.randn(embedding.shape, generator=generator))])
    after = collect("rl-llm/TicTacToe-v0", policy, seeds=[2])[0]
    assert (before.policy_version, after.policy_version) == (0, 1)
    assert after.logprobs != before.logprobs
    assert_logprobs_match_forward_pass(after, policy.model)
    with pytest.raises(KeyError, match="no parameter"):
        policy.load_weights([("not.a.parameter", torch.zeros(1))])


def test_llm_policies_also_play_outside_the_engine_through_an_episode_agent(make_tiny_policy) -> None:
    policy = make_tiny_policy(max_new_tokens=6)
    env = gym.make("rl-llm/TicTacToe-v0")
    observation, info = env.reset(seed=0)
    agent = policy.start_episode(EpisodeStart(env, info, seed=0))
    assert agent.stop == ("</move>",) and policy.stop == (), "the env's stop strings go to its episode's agent only"
    completion = agent.act([Message("system", info["system_prompt"]), Message("user", observation)])
    assert completion.token_ids and policy.decode(completion.token_ids) == completion.text
    env.step(completion.text)
    env.close()


def test_make_policy_builds_llm_agents_and_explains_bad_specs(tiny_model_dir: Path) -> None:
    policy = make_policy(f"hf:{tiny_model_dir}", "rl-llm/TicTacToe-v0", seed=0, max_new_tokens=5, temperature=0.5,
                         device="cpu")  # fmt: skip
    assert policy.sampling.max_new_tokens == 5 and policy.sampling.temperature == 0.5
    assert collect("rl-llm/TicTacToe-v0", policy, seeds=[0])[0].num_policy_tokens > 0
    with pytest.raises(ValueError, match="URL#MODEL"):
        make_policy("openai:http://localhost:1", "rl-llm/TicTacToe-v0")
    with pytest.raises(ValueError, match="unknown agent backend"):
        make_policy("gpt:foo", "rl-llm/TicTacToe-v0")
    with pytest.raises(ValueError, match="needs a model"):
        make_policy("hf:", "rl-llm/TicTacToe-v0")
    with pytest.raises(ValueError, match="apply to LLM agents"):
        make_policy("minimax", "rl-llm/TicTacToe-v0", temperature=0.5)
    (baseline,) = collect("rl-llm/TicTacToe-v0", make_policy("minimax", "rl-llm/TicTacToe-v0"), seeds=[0])
    assert baseline.error is None and baseline.terminated and not baseline.token_ids  # any agent plays
    with pytest.raises(TypeError, match="plays a Policy"):
        collect("rl-llm/TicTacToe-v0", object(), seeds=[0])


def test_policy_tokens_are_the_only_ones_with_log_probs(make_tiny_policy) -> None:
    policy = make_tiny_policy(max_new_tokens=6)
    trajectory = collect("rl-llm/ContextualBandit-v0", policy, seeds=[3], env_kwargs={"horizon": 2})[0]
    roles = set(trajectory.token_roles)
    assert roles == {TokenRole.PROMPT, TokenRole.POLICY, TokenRole.ENV}
    assert trajectory.num_policy_tokens == sum(t.token_end - t.token_start for t in trajectory.turns)


def test_try_again_wraps_a_registered_env_for_the_rollout_engine(make_tiny_policy) -> None:
    from rl_llm.envs.wrappers import TryAgain

    def make_env() -> gym.Env:  # one illegal move loses the game: each attempt is one turn of a random model
        return TryAgain(gym.make("rl-llm/TicTacToe-v0", max_illegal_moves=0), max_attempts=3)

    policy = make_tiny_policy(max_new_tokens=6)
    (trajectory,) = collect(make_env, policy, seeds=[0])
    assert trajectory.error is None and trajectory.end_reason in ("terminated", "truncated")
    assert len(trajectory.turns) <= 3
    if trajectory.truncated:  # three lost games: unary feedback after the first two
        assert all(turn.observation.startswith("Incorrect. Please think again.") for turn in trajectory.turns[:2])
    assert_token_bookkeeping(trajectory, policy)


@pytest.mark.parametrize("max_new_tokens", [2, 6])  # the exact path (canonical logits), the cached one
def test_each_request_samples_the_same_tokens_and_log_probs_in_any_batch(make_tiny_policy, max_new_tokens: int) -> None:
    # Batch composition follows thread timing: a request's tokens and recorded log-probs must not depend on it.
    policy = make_tiny_policy(temperature=1.0, top_p=0.95, max_new_tokens=max_new_tokens, seed=3)
    generator = torch.Generator().manual_seed(0)
    lengths = [5, 31, 32, 40, 63, 64, 65, 120]  # around the padding multiple, so rows share or split buckets
    requests = [
        GenerationRequest(messages=[], prompt_ids=torch.randint(0, 1000, (n,), generator=generator).tolist(),
                          metadata={"seed": 7, "group_index": i, "turn": 0})
        for i, n in enumerate(lengths)
    ]  # fmt: skip
    alone = [policy.generate([request])[0] for request in requests]
    for order in ([7, 6, 5, 4, 3, 2, 1, 0], [2, 3], [4, 0, 5]):
        together = policy.generate([requests[i] for i in order])
        assert [(c.token_ids, c.logprobs) for c in together] == [(alone[i].token_ids, alone[i].logprobs) for i in order]
    # The draw is named by (policy seed, episode seed, group, turn): another turn or another policy seed, other tokens.
    later = GenerationRequest(messages=[], prompt_ids=requests[0].prompt_ids, metadata={"seed": 7, "group_index": 0, "turn": 1})
    reseeded = make_tiny_policy(temperature=1.0, top_p=0.95, max_new_tokens=max_new_tokens, seed=4)
    assert policy.generate([later])[0].token_ids != alone[0].token_ids
    assert reseeded.generate([requests[0]])[0].token_ids != alone[0].token_ids
