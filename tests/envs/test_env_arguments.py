"""A bad constructor argument fails at ``gym.make`` with one line naming it, for every registered env: never a
NaN reward, an extra turn, or an overflow or TypeError deep inside the first step (rl_llm/checks.py)."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

import rl_llm  # noqa: F401  (registers the envs)

NOT_A_COUNT = ["x", 2.5, math.nan, math.inf, True, None]
NOT_A_NUMBER = ["x", math.nan, math.inf, -math.inf, True, None, [1.0]]
NOT_A_TIMEOUT = [*NOT_A_NUMBER, 0, -1.0, 1e30]

CASES = [  # (env id, argument, bad values)
    ("rl-llm/MultiArmedBandit-v0", "horizon", [*NOT_A_COUNT, 0]),
    ("rl-llm/MultiArmedBandit-v0", "num_arms", [*NOT_A_COUNT, 1, 27]),
    ("rl-llm/MultiArmedBandit-v0", "sigma", [*NOT_A_NUMBER, 0, -1]),
    ("rl-llm/MultiArmedBandit-v0", "gap", ["x", math.nan, math.inf, True, 0, 1.5]),
    ("rl-llm/MultiArmedBandit-v0", "invalid_action_penalty", [*NOT_A_NUMBER, -1]),
    ("rl-llm/MultiArmedBandit-v0", "ucb_c", [*NOT_A_NUMBER, -0.5]),
    ("rl-llm/MultiArmedBandit-v0", "means", ["xyz", [[1, 2], [3]], {"a": 1}]),
    ("rl-llm/ContextualBandit-v0", "horizon", [*NOT_A_COUNT, 0, 10**30, 10**9]),
    ("rl-llm/ContextualBandit-v0", "context_dim", [*NOT_A_COUNT, 0, 17]),
    ("rl-llm/ContextualBandit-v0", "noise", [*NOT_A_NUMBER, -0.1]),
    ("rl-llm/ContextualBandit-v0", "linucb_alpha", [*NOT_A_NUMBER, -1]),
    ("rl-llm/TicTacToe-v0", "max_turns", [*NOT_A_COUNT[:-1], 0]),  # None: the default
    ("rl-llm/TicTacToe-v0", "max_illegal_moves", [*NOT_A_COUNT[:-1], -1]),
    ("rl-llm/TicTacToe-v0", "illegal_move_penalty", [*NOT_A_NUMBER, -1]),
    ("rl-llm/TicTacToe-v0", "opponent_skill", [*NOT_A_NUMBER, -0.1, 1.5]),
    ("rl-llm/TicTacToe-v0", "show_legal_moves", ["false", 0, None, []]),
    ("rl-llm/Terminal-v0", "max_turns", [*NOT_A_COUNT, 0]),
    ("rl-llm/Terminal-v0", "time_budget_s", NOT_A_TIMEOUT),
    ("rl-llm/Terminal-v0", "command_timeout_s", NOT_A_TIMEOUT),
    ("rl-llm/Terminal-v0", "check_timeout_s", NOT_A_TIMEOUT),
    ("rl-llm/Terminal-v0", "max_output_chars", [*NOT_A_COUNT, 0]),
    ("rl-llm/TextToSQL-v0", "max_turns", NOT_A_COUNT[:-1]),  # None: the protocol's
    ("rl-llm/TextToSQL-v0", "query_timeout_s", NOT_A_TIMEOUT),
    ("rl-llm/TextToSQL-v0", "gold_timeout_s", NOT_A_TIMEOUT),
    ("rl-llm/TextToSQL-v0", "sample_rows", [*NOT_A_COUNT, -1]),
    ("rl-llm/TextToSQL-v0", "max_result_rows", [*NOT_A_COUNT, 0]),
    ("rl-llm/TextToSQL-v0", "max_result_bytes", [*NOT_A_COUNT, 0]),
    ("rl-llm/TextToSQL-v0", "display_rows", [*NOT_A_COUNT, 0]),
    ("rl-llm/TextToSQL-v0", "display_chars", [*NOT_A_COUNT, 99]),
    ("rl-llm/TextToSQL-v0", "float_tolerance", [*NOT_A_NUMBER, -1e-6]),
    ("rl-llm/TextToSQL-v0", "cache_gold_results", ["no", 0, None]),
    ("rl-llm/TextToSQL-v0", "format_gate", ["no", 1]),
    ("rl-llm/TextToSQL-v0", "generated_databases", [*NOT_A_COUNT, 0, 10**9]),
    ("rl-llm/TextToSQL-v0", "generator_seed", [*NOT_A_COUNT, -1]),
    ("rl-llm/TextToSQL-v0", "generated_dir", [-1, 2.5, "", True]),
    ("rl-llm/Search-v0", "top_k", [*NOT_A_COUNT, 0]),
    ("rl-llm/Search-v0", "max_passage_chars", [*NOT_A_COUNT, 0]),
    ("rl-llm/Search-v0", "kb_seed", [*NOT_A_COUNT, -1]),
    ("rl-llm/Search-v0", "cache_dir", [-1, 2.5, "", True]),
    ("rl-llm/ToolCalls-v0", "top_k", [*NOT_A_COUNT, 0]),
    ("rl-llm/ToolCalls-v0", "max_calls_per_turn", [*NOT_A_COUNT, 0]),
    ("rl-llm/ToolCalls-v0", "max_output_chars", [*NOT_A_COUNT, 0]),
    ("rl-llm/ToolCalls-v0", "python_timeout", NOT_A_TIMEOUT),
    ("rl-llm/ToolCalls-v0", "sandbox_backend", ["chroot", None, 1]),
    ("rl-llm/ToolCalls-v0", "cache_dir", [-1, 2.5, "", True]),
]


@pytest.mark.parametrize(("env_id", "name", "values"), CASES, ids=[f"{e.split('/')[1]}-{n}" for e, n, _ in CASES])
def test_a_bad_argument_is_refused_at_make_naming_it(env_id: str, name: str, values: list, tmp_path, monkeypatch
                                                     ) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)  # a path argument taken by mistake would make a folder here
    for value in values:
        with pytest.raises(ValueError, match=name) as caught:
            gym.make(env_id, **{name: value}).close()
        assert "\n" not in str(caught.value), str(caught.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("env_id", "kwargs"), [
    ("rl-llm/MultiArmedBandit-v0", {"horizon": np.int64(3), "sigma": np.float32(0.5), "num_arms": np.int32(4)}),
    ("rl-llm/ContextualBandit-v0", {"horizon": 100_000, "noise": 0, "linucb_alpha": np.float64(0.5)}),
    ("rl-llm/TicTacToe-v0", {"illegal_move_penalty": 0, "max_illegal_moves": 0, "show_legal_moves": np.bool_(False)}),
    ("rl-llm/Terminal-v0", {"time_budget_s": 1_000_000, "command_timeout_s": 0.5, "max_output_chars": 1}),
])  # fmt: skip
def test_good_values_at_the_bounds_and_numpy_numbers_are_taken(env_id: str, kwargs: dict) -> None:
    env = gym.make(env_id, **kwargs)
    try:
        for name, value in kwargs.items():
            assert getattr(env.unwrapped, name) == value
            assert not isinstance(getattr(env.unwrapped, name), np.generic)  # plain Python numbers from here on
    finally:
        env.close()


def test_a_bandit_with_a_bad_penalty_used_to_pay_nan() -> None:
    """The case that matters most: NaN passed ``< 0`` and every invalid turn's reward was NaN."""
    env = gym.make("rl-llm/MultiArmedBandit-v0", horizon=2)
    env.reset(seed=0)
    _, reward, *_ = env.step("no tag")
    assert reward == -1.0
    with pytest.raises(ValueError, match="invalid_action_penalty must be a finite number, got nan"):
        gym.make("rl-llm/MultiArmedBandit-v0", invalid_action_penalty=math.nan)


def test_math_arguments() -> None:
    from rl_llm.envs.math.problems import reasoning_gym_import_error

    if (missing := reasoning_gym_import_error()) is not None:
        pytest.skip(f"Math-v0 needs {missing}")
    for name, values in (("format_penalty", [*NOT_A_NUMBER, -0.5]), ("difficulty", [True, 2.5, 0, "1"]),
                         ("max_turns", [*NOT_A_COUNT, 0])):  # fmt: skip
        for value in values:
            with pytest.raises(ValueError, match=name):
                gym.make("rl-llm/Math-v0", **{name: value})


def test_the_old_import_path_of_the_checks_still_works() -> None:
    """docs/writing-an-environment.md told env authors to use ``rl_llm.envs.arguments``; it is rl_llm.checks now."""
    import importlib

    from rl_llm import checks

    assert importlib.import_module("rl_llm.envs.arguments") is checks
    from rl_llm.envs import arguments

    assert arguments.integer is checks.integer
