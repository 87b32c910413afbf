"""rl-llm/Math-v0: reasoning-gym problems graded with math-verify, alone and under TryAgain / MultiAttempt.

The env contract (check_env, reset info, fuzzing, seeding) is covered for every registered env in
test_registered_envs.py; this file tests what is particular to Math-v0.
"""

from __future__ import annotations

import math
import re

import gymnasium as gym
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rl_llm  # noqa: F401
from rl_llm.agents.baselines import make_baseline
from rl_llm.agents.evaluate import evaluate
from rl_llm.envs.math.problems import DIFFICULTIES, FAMILIES, reasoning_gym_import_error
from rl_llm.envs.wrappers import MultiAttempt, TryAgain
from tests.conftest import hostile_text

if (_missing := reasoning_gym_import_error()) is not None:
    pytest.skip(f"needs {_missing}", allow_module_level=True)

from rl_llm.envs.math.answers import MAX_ANSWER_CHARS, extract_answer, is_correct
from rl_llm.envs.math.problems import generate

ENV_ID = "rl-llm/Math-v0"


def gold(env: gym.Env) -> str:
    return env.unwrapped.current_task.answer


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_and_level_generates_seeded_integer_problems(family: str) -> None:
    for difficulty in DIFFICULTIES:
        problems = [generate(family, difficulty, seed) for seed in range(5)]
        assert problems[0] == generate(family, difficulty, 0), "a seed names one problem"
        assert len({p.question for p in problems}) > 1
        assert all(re.fullmatch(r"-?\d+", p.answer) and p.id.startswith(f"math-{family}-d{difficulty}-") for p in problems)


@pytest.mark.parametrize("answer_format", ["answer", "boxed"])
@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_the_oracle_scores_one_on_every_family_level_and_format(answer_format: str, difficulty: int) -> None:
    for family in FAMILIES:
        policy = make_baseline("oracle", ENV_ID, seed=0)
        make = lambda family=family: gym.make(ENV_ID, families=[family], difficulty=difficulty,  # noqa: E731
                                              answer_format=answer_format)
        trajectories = evaluate(make, policy, 3, seed=difficulty)
        assert [t.total_reward for t in trajectories] == [1.0] * 3, family


def test_the_random_baseline_answers_in_format_and_rarely_scores() -> None:
    trajectories = evaluate(ENV_ID, make_baseline("random", ENV_ID, seed=0), 30, seed=0, env_kwargs={"difficulty": 2})
    assert all(len(t.turns) == 1 for t in trajectories), "every guess is a well-formed final answer"
    assert sum(t.total_reward for t in trajectories) < 10


@pytest.mark.parametrize(("answer", "expected"), [
    ("-4", True), ("$-4$", True), ("x = -4", True), ("-4.0", True), ("\\(-4\\)", True), ("\u22124", True),
    ("-4 \\text{ legs}", True), ("5 - 3 - 6 = -4", True), ("\\boxed{-4}", True),
    ("4", False), ("5 - 3 - 6", False), ("\\frac{-8}{2}", False), ("-8/2", False), ("5 or -4", False),
    ("-4, 5", False), ("(-4)", False), ("-4" + " " * MAX_ANSWER_CHARS, False),
])  # fmt: skip
def test_an_answer_must_be_one_evaluated_number(answer: str, expected: bool) -> None:
    assert is_correct(answer, "-4") is expected


def test_thousands_separators_and_latex_spacing_are_read() -> None:
    assert all(is_correct(text, "1234") for text in ("1,234", "1{,}234", "\\$1{,}234", "+1234"))
    assert not is_correct("9^9", "387420489") and not is_correct("387420489!", "387420489")


def test_restating_the_question_scores_nothing() -> None:
    # math-verify alone evaluates "36 * 98" to the product: the env must not grade an expression as right.
    env = gym.make(ENV_ID, families=["products"], difficulty=2)
    observation, _ = env.reset(seed=0)
    expression = re.search(r"multiplication: (.+?)\.", observation)[1]
    _, reward, terminated, _, info = env.step(f"<answer>{expression}</answer>")
    assert terminated and reward == 0.0 and info["correct"] is False
    env.reset(seed=0)
    assert env.step(f"<answer>{expression} = {gold(env)}</answer>")[1] == 1.0


def test_a_turn_without_an_answer_gets_a_corrective_observation() -> None:
    env = gym.make(ENV_ID, format_penalty=0.1)
    env.reset(seed=1)
    observation, reward, terminated, truncated, info = env.step("I think it is probably 12")
    assert info["invalid_action"] and not (terminated or truncated)
    assert observation.startswith("No final answer found") and "<answer>" in observation
    assert reward == pytest.approx(-0.1) and info["metrics"] == {"correct": 0.0, "answered": 0.0}
    _, reward, terminated, _, info = env.step(f"<answer>{gold(env)}</answer>")
    assert terminated and reward == 1.0 and info["answer"] == gold(env) and info["metrics"]["correct"] == 1.0


def test_boxed_format_reads_the_last_box_and_has_no_stop_string() -> None:
    env = gym.make(ENV_ID, answer_format="boxed")
    _, info = env.reset(seed=2)
    assert info["stop"] == [] and "\\boxed{}" in info["system_prompt"]
    wrong = int(gold(env)) + 1
    _, reward, terminated, _, _ = env.step(f"First \\boxed{{{wrong}}}, no: \\boxed{{{gold(env)}}}")
    assert terminated and reward == 1.0
    env.reset(seed=2)
    assert env.step(f"<answer>{gold(env)}</answer>")[4]["invalid_action"], "an <answer> tag is not a box"


def test_options_pick_the_family_and_bad_arguments_are_refused() -> None:
    env = gym.make(ENV_ID)
    _, info = env.reset(seed=3, options={"family": "gcd"})
    assert info["family"] == "gcd" and info["task_id"].startswith("math-gcd-d1-")
    with pytest.raises(ValueError, match="family"):
        env.reset(seed=3, options={"family": "calculus"})
    for kwargs in ({"families": ["calculus"]}, {"difficulty": 4}, {"answer_format": "latex"}, {"families": []}):
        with pytest.raises(ValueError):
            gym.make(ENV_ID, **kwargs)


def test_try_again_on_math_restates_the_problem_and_halves_the_reward() -> None:
    env = TryAgain(gym.make(ENV_ID, max_turns=1))
    question, _ = env.reset(seed=4)
    observation, reward, terminated, _, info = env.step(f"<answer>{int(gold(env)) + 1}</answer>")
    assert (reward, terminated) == (0.0, False) and info["inner_reward_components"] == {"correct": 0.0}
    assert observation.startswith("Incorrect. Please think again.") and observation.endswith(question)
    _, reward, terminated, _, info = env.step(f"<answer>{gold(env)}</answer>")
    assert terminated and reward == 0.5 and info["metrics"]["attempts"] == 2.0


def test_try_again_on_math_punishes_garbage_more_than_repeating() -> None:
    garbage, repeated = TryAgain(gym.make(ENV_ID, max_turns=1)), TryAgain(gym.make(ENV_ID, max_turns=1))
    garbage.reset(seed=5)
    repeated.reset(seed=5)
    wrong = f"<answer>{int(gold(repeated)) + 1}</answer>"
    totals = [0.0, 0.0]
    for _ in range(5):
        totals[0] += garbage.step("no idea")[1]
        totals[1] += repeated.step(wrong)[1]
    assert totals[1] == pytest.approx(-0.4) and totals[0] < totals[1]


def test_multi_attempt_on_math_in_the_boxed_format() -> None:
    env = MultiAttempt(gym.make(ENV_ID, answer_format="boxed", max_turns=1), attempts=3)
    _, info = env.reset(seed=6)
    assert info["system_prompt"].endswith("You have 3 attempts to answer the question.")
    observation, *_ = env.step("I am not sure.")  # no box: the attempt is used up
    assert observation.startswith("Your answer is incorrect. You have 2 attempts left.")
    env.step(f"\\boxed{{{int(gold(env)) - 1}}}")
    _, reward, terminated, _, info = env.step(f"\\boxed{{{gold(env)}}}")
    assert terminated and reward == 1.0 and info["metrics"]["answers"] == 2.0
    env.reset(seed=6)
    for _ in range(3):
        _, reward, terminated, *_ = env.step(f"\\boxed{{{int(gold(env)) + 7}}}")
    assert terminated and reward == -0.5


@given(actions=st.lists(hostile_text(), min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_wrapped_math_survives_arbitrary_text(actions: list[str], seed: int) -> None:
    env = TryAgain(gym.make(ENV_ID, answer_format="boxed"), max_attempts=2)
    env.reset(seed=seed)
    for turn in range(env.max_turns):
        observation, reward, terminated, truncated, _ = env.step(actions[turn % len(actions)])
        assert isinstance(observation, str) and math.isfinite(reward)
        if terminated or truncated:
            break
    else:
        pytest.fail("the wrapped episode did not end")
    assert extract_answer("\\boxed{" * 1000, "boxed") is None


def test_try_again_counts_one_value_written_differently_as_a_repeat() -> None:
    env = TryAgain(gym.make(ENV_ID, max_turns=1), max_attempts=3)
    env.reset(seed=7)
    wrong = int(gold(env)) + 1
    for text in (f"<answer>{wrong}</answer>", f"<answer>x = {wrong}</answer>"):
        env.step(text)
    _, _, _, truncated, info = env.step(f"<answer>${wrong}.0$</answer>")
    assert truncated and info["answer"] == f"{wrong}.0" and info["metrics"]["distinct_answer_fraction"] == pytest.approx(1 / 3)
