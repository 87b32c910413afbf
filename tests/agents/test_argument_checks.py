"""The arguments a caller passes to the agents' public API are checked where they are given: one ValueError naming
the argument, what it takes and what it got.

Before, a NaN concurrency made a semaphore no episode passed (a hang), a NaN temperature made every probability
NaN, a negative seed was refused by numpy inside every ``env.reset``, a float count failed in ``range`` and a
timeout of 1e30 overflowed the socket on the first request. Booleans are refused where a number is meant;
numpy numbers are taken (and become Python numbers, which JSON bodies and gymnasium need).
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest

from rl_llm.agents import SamplingParams, collect, make_baseline, make_policy
from rl_llm.agents.baselines.bandits import UCB1, EpsilonGreedy, LinUCBAgent
from rl_llm.agents.baselines.terminal import RandomCommands
from rl_llm.agents.evaluate import evaluate
from rl_llm.agents.openai_backend import OpenAIPolicy
from rl_llm.agents.rollout import RolloutEngine, collect_games
from rl_llm.agents.tournament import play_matches
from rl_llm.agents.vllm_server import VLLMServerPolicy

BANDIT = "rl-llm/MultiArmedBandit-v0"
GAME = "prisoners_dilemma_v0"
CLOSED_URL = "http://127.0.0.1:9"  # nothing listens: no test here sends a request

NAN, INF = math.nan, math.inf


def bandit_policy() -> Any:
    return make_baseline("random", BANDIT, seed=0)


# -- sampling settings (every LLM backend, hf's sampler included) -------------------------------------------
@pytest.mark.parametrize(("name", "value"), [
    ("max_new_tokens", NAN), ("max_new_tokens", 1.5), ("max_new_tokens", True), ("max_new_tokens", "3"),
    ("temperature", NAN), ("temperature", INF), ("temperature", True), ("temperature", None),
    ("top_p", True), ("top_p", "0.5"),
    ("top_k", NAN), ("top_k", 1.5), ("top_k", True), ("top_k", INF),
])  # fmt: skip
def test_sampling_params_refuse(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be .*got {re.escape(repr(value))}$"):
        SamplingParams(**{name: value})


def test_sampling_params_valid_edges() -> None:
    greedy = SamplingParams(max_new_tokens=1, temperature=0, top_p=1.0, top_k=0)  # temperature 0: greedy
    assert (greedy.temperature, greedy.logprob_temperature) == (0.0, 1.0)
    numpy = SamplingParams(max_new_tokens=np.int64(8), temperature=np.float32(0.5), top_p=np.float64(0.9),
                           top_k=np.int64(5))  # fmt: skip
    assert numpy == SamplingParams(8, 0.5, 0.9, 5)
    assert [type(v) for v in (numpy.max_new_tokens, numpy.temperature, numpy.top_p, numpy.top_k)] == [int, float, float, int]


# -- the rollout engine, collect, collect_games, evaluate ----------------------------------------------------
@pytest.mark.parametrize(("name", "value"), [
    ("concurrency", NAN), ("concurrency", INF), ("concurrency", 1.5), ("concurrency", True), ("concurrency", "3"),
    ("max_new_tokens", 0), ("max_new_tokens", -1), ("max_new_tokens", NAN), ("max_new_tokens", 1.5),
    ("max_new_tokens", True), ("env_workers", 0), ("env_workers", NAN), ("env_workers", 1.5),
    ("max_batch_size", 0), ("max_batch_size", -1), ("max_batch_size", 1.5), ("max_batch_size", "3"),
    ("max_context_tokens", 0), ("max_context_tokens", -1), ("max_context_tokens", NAN), ("max_context_tokens", "3"),
    ("gather_timeout_s", -1), ("gather_timeout_s", NAN), ("gather_timeout_s", INF), ("gather_timeout_s", 1e30),
    ("gather_timeout_s", "x"), ("gather_timeout_s", True),
])  # fmt: skip
def test_rollout_engine_refuses(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be .*got {re.escape(repr(value))}$"):
        RolloutEngine(bandit_policy(), BANDIT, **{name: value})


def test_rollout_engine_valid_edges() -> None:
    engine = RolloutEngine(bandit_policy(), BANDIT, concurrency=np.int64(1), env_workers=1, max_batch_size=1,
                           max_context_tokens=1, gather_timeout_s=0, max_new_tokens=None)  # fmt: skip
    assert (engine.concurrency, type(engine.concurrency), engine.gather_timeout_s) == (1, int, 0.0)
    assert RolloutEngine(bandit_policy(), BANDIT, concurrency=10**30).concurrency == 10**30  # huge: just no limit


@pytest.mark.parametrize(("seeds", "message"), [
    ([-1], r"^seeds\[0\] must be an integer >= 0, got -1$"),
    ([0, 1.5], r"^seeds\[1\] must be an integer, got 1.5$"),
    ([True], r"^seeds\[0\] must be an integer, got True$"),
    ([NAN], r"^seeds\[0\] must be an integer, got nan$"),
    (["a"], r"^seeds\[0\] must be an integer, got 'a'$"),
    (3, r"^seeds must be a sequence of ints >= 0 \(or None\), got 3$"),
    ("ab", r"^seeds must be a sequence of ints >= 0 \(or None\), got 'ab'$"),
])  # fmt: skip
def test_collect_refuses_seeds(seeds: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        collect(BANDIT, bandit_policy(), seeds)


@pytest.mark.parametrize("group_size", [NAN, 1.5, True, "3", np.float64(2.0)])
def test_collect_refuses_group_size(group_size: Any) -> None:
    with pytest.raises(ValueError, match=rf"^group_size must be an integer.*got {re.escape(repr(group_size))}$"):
        collect(BANDIT, bandit_policy(), [0], group_size)


def test_collect_takes_numpy_and_unseeded_seeds() -> None:
    # gymnasium refuses a numpy integer as a seed: it is played as the Python int
    trajectories = collect(BANDIT, bandit_policy(), [np.int64(3), None], np.int64(2), concurrency=np.int64(2))
    assert [(t.seed, t.error) for t in trajectories] == [(3, None), (3, None), (None, None), (None, None)]
    assert type(trajectories[0].seed) is int


@pytest.mark.parametrize(("arguments", "message"), [
    ({"seeds": [-1]}, r"^seeds\[0\] must be an integer >= 0, got -1$"),
    ({"seeds": [0], "group_size": 1.5}, r"^group_size must be an integer, got 1.5$"),
    ({"seeds": [0], "concurrency": NAN}, r"^concurrency must be an integer, got nan$"),
    ({"seeds": [0], "game": 3}, r"^game must be a game's name such as 'prisoners_dilemma_v0', got 3$"),
])  # fmt: skip
def test_collect_games_refuses(arguments: dict[str, Any], message: str) -> None:
    game = arguments.pop("game", GAME)
    with pytest.raises(ValueError, match=message):
        collect_games(game, make_baseline("always_cooperate", GAME), **arguments)


@pytest.mark.parametrize(("name", "value"), [
    ("episodes", -1), ("episodes", 1.5), ("episodes", NAN), ("episodes", True), ("episodes", np.float64(2.0)),
    ("seed", -1), ("seed", 1.5), ("seed", None), ("seed", True), ("seed", "3"),
    ("batch_size", 1.5), ("batch_size", True), ("batch_size", INF), ("batch_size", 0),
])  # fmt: skip
def test_evaluate_refuses(name: str, value: Any) -> None:
    arguments: dict[str, Any] = {"episodes": 2, "seed": 0, "batch_size": 2, name: value}
    with pytest.raises(ValueError, match=rf"^{name} must be .*got {re.escape(repr(value))}$"):
        evaluate(BANDIT, bandit_policy(), arguments.pop("episodes"), **arguments)


def test_evaluate_valid_edges() -> None:
    assert evaluate(BANDIT, bandit_policy(), 0) == []  # no episodes: nothing to play
    trajectories = evaluate(BANDIT, bandit_policy(), np.int64(2), seed=np.int64(5), batch_size=np.int64(1))
    assert [t.seed for t in trajectories] == [5, 6]


# -- agents from specs and baselines -------------------------------------------------------------------------
@pytest.mark.parametrize(("call", "message"), [
    (lambda: make_policy(None, BANDIT), r"^spec must be a str such as 'random' or 'hf:tiny', got None$"),
    (lambda: make_policy(3, BANDIT), r"^spec must be a str .*got 3$"),
    (lambda: make_policy("random", BANDIT, seed=-1), r"^seed must be an integer >= 0, got -1$"),
    (lambda: make_policy("random", BANDIT, seed=1.5), r"^seed must be an integer, got 1.5$"),
    (lambda: make_baseline("minimax", "rl-llm/TicTacToe-v0", seed=-1), r"^seed must be an integer >= 0, got -1$"),
    (lambda: make_baseline("random", BANDIT, seed=True), r"^seed must be an integer, got True$"),
    (lambda: make_baseline("oracle", "rl-llm/Math-v0", seed=NAN), r"^seed must be an integer, got nan$"),
    (lambda: EpsilonGreedy(epsilon=NAN), r"^epsilon must be a finite number, got nan$"),
    (lambda: EpsilonGreedy(epsilon=1.5), r"^epsilon must be in \[0.0, 1.0\], got 1.5$"),
    (lambda: UCB1(c=NAN), r"^c must be a finite number, got nan$"),
    (lambda: UCB1(c=-1), r"^c must be >= 0.0, got -1$"),
    (lambda: LinUCBAgent(alpha=INF), r"^alpha must be a finite number, got inf$"),
    (lambda: RandomCommands(p_done=2), r"^p_done must be in \[0.0, 1.0\], got 2$"),
])  # fmt: skip
def test_policies_refuse(call: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_baseline_valid_edges() -> None:
    assert make_baseline("random", BANDIT, seed=np.int64(2**70 // 2**10)).rng.integers(10) >= 0  # big seeds are fine
    assert make_policy("ucb", BANDIT, seed=0).c == 0.5
    assert (EpsilonGreedy(epsilon=0).epsilon, EpsilonGreedy(epsilon=1).epsilon, UCB1(c=0).c) == (0.0, 1.0, 0.0)


# -- HTTP backends -------------------------------------------------------------------------------------------
CLIENT_CASES = [
    ("timeout_s", 0), ("timeout_s", -1), ("timeout_s", NAN), ("timeout_s", INF), ("timeout_s", 1e30),
    ("timeout_s", True), ("timeout_s", None), ("timeout_s", "3"),
    ("max_retries", 1.5), ("max_retries", NAN), ("max_retries", True), ("max_retries", INF),
    ("max_concurrency", 0), ("max_concurrency", -1), ("max_concurrency", 1.5), ("max_concurrency", NAN),
    ("max_response_bytes", NAN), ("max_response_bytes", 1.5), ("max_response_bytes", True),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value"), [*CLIENT_CASES, ("backoff_s", -1), ("backoff_s", NAN), ("backoff_s", INF)])
def test_openai_policy_refuses(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be .*got {re.escape(repr(value))}$"):
        OpenAIPolicy(CLOSED_URL, "m", **{name: value})


def test_openai_policy_valid_edges() -> None:
    policy = OpenAIPolicy(CLOSED_URL, "m", timeout_s=np.float64(0.5), max_retries=0, backoff_s=0,
                          max_concurrency=np.int64(1), max_response_bytes=1)  # fmt: skip
    client = policy.client
    assert (client.timeout_s, client.max_retries, client.backoff_s, client.max_concurrency) == (0.5, 0, 0.0, 1)
    assert type(client.max_concurrency) is int
    policy.close()


@pytest.mark.parametrize(("name", "value"), [*CLIENT_CASES, ("seed", 1.5), ("seed", True), ("seed", -1)])
def test_vllm_server_policy_refuses(name: str, value: Any) -> None:
    # Checked before the tokenizer loads and before the server is asked anything (no vLLM needed).
    with pytest.raises(ValueError, match=rf"^{name} must be .*got {re.escape(repr(value))}$"):
        VLLMServerPolicy(CLOSED_URL, "m", tokenizer=object(), **{name: value})


# -- the hf backend ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "value"), [
    ("max_batch_size", 0), ("max_batch_size", 1.5), ("max_batch_size", True), ("seed", -1), ("seed", 1.5),
    ("seed", True), ("seed", 2**64), ("dtype", "float33"),
])  # fmt: skip
def test_hf_policy_refuses(name: str, value: Any) -> None:
    from rl_llm.agents.hf import HFPolicy

    with pytest.raises(ValueError, match=rf"^{name} must .*got {re.escape(repr(value))}$"):
        HFPolicy("tiny", device="cpu", **{name: value})


def test_hf_policy_valid_edges(make_tiny_policy: Any) -> None:
    policy = make_tiny_policy(seed=2**64 - 1, max_batch_size=np.int64(1), temperature=0, max_new_tokens=2)
    assert (policy.seed, policy.max_batch_size, type(policy.max_batch_size)) == (2**64 - 1, 1, int)
    (trajectory,) = collect(BANDIT, policy, [0], max_new_tokens=1, max_context_tokens=10**6)
    assert trajectory.error is None and all(turn.token_end - turn.token_start == 1 for turn in trajectory.turns)


# -- tournaments and the Ray pool ----------------------------------------------------------------------------
def test_play_matches_refuses_negative_seed() -> None:
    seats = (make_baseline("always_cooperate", GAME), make_baseline("always_defect", GAME))
    with pytest.raises(ValueError, match=r"^seeds\[1\] must be an integer >= 0, got -3$"):
        play_matches(GAME, seats, [0, -3])


@pytest.mark.parametrize(("name", "value"), [
    ("num_workers", 1.5), ("num_workers", True), ("num_workers", NAN), ("max_concurrency", 0),
    ("max_concurrency", 1.5), ("call_timeout_s", NAN), ("call_timeout_s", 0), ("call_timeout_s", 1e30),
    ("max_restarts", -1), ("max_restarts", 1.5),
])  # fmt: skip
def test_ray_pool_refuses_before_ray_starts(name: str, value: Any) -> None:
    from rl_llm.agents.ray_pool import RayEnvPool

    with pytest.raises(ValueError, match=rf"^{name} must be .*got {re.escape(repr(value))}$"):
        RayEnvPool(lambda: None, **{name: value})
