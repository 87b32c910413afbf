"""TryAgain (UFO) and MultiAttempt over a small verifiable-answer env (an arithmetic question)."""

from __future__ import annotations

import math
import re
from typing import Any

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given
from hypothesis import strategies as st

import rl_llm  # noqa: F401
from rl_llm.envs.base import Outcome, Task, TextEnv
from rl_llm.envs.parsing import extract_tag
from rl_llm.envs.wrappers import MultiAttempt, TryAgain
from rl_llm.envs.wrappers.attempts import normalise_answer
from tests.conftest import hostile_text


class ArithmeticEnv(TextEnv):
    """What is a + b? Answer inside <answer></answer>. Follows the wrappers' verifiable-answer protocol."""

    stop = ("</answer>",)

    def __init__(self, report_correct: bool = True, max_turns: int = 2) -> None:
        super().__init__(max_turns=max_turns)
        self.report_correct = report_correct

    def _reset(self, options: dict[str, Any]) -> Task:
        self.a, self.b = (int(x) for x in self.np_random.integers(0, 50, size=2))
        return Task(f"What is {self.a} + {self.b}?", f"add-{self.a}-{self.b}", "Only give the final answer between <answer> and </answer>.")

    def _step(self, action: str) -> Outcome:
        answer = extract_tag(action, "answer", last=True)
        if answer is None:
            return Outcome("Put your answer inside <answer></answer>.", {"format": 0.0}, invalid_action=True)
        correct = answer == str(self.a + self.b)
        info = {"correct": correct, "answer": answer} if self.report_correct else {}
        return Outcome("done", {"correct": float(correct)}, terminated=True, metrics={"right": float(correct)}, info=info)


def answer(value: int | str) -> str:
    return f"<answer>{value}</answer>"


def right(env) -> int:
    return env.unwrapped.a + env.unwrapped.b


@pytest.mark.filterwarnings("ignore:.*is different from the unwrapped version")  # checking the wrapper is the point
@pytest.mark.parametrize("wrapper", [TryAgain, MultiAttempt])
def test_wrapped_envs_pass_the_gymnasium_checker(wrapper) -> None:
    check_env(wrapper(ArithmeticEnv()), skip_render_check=True)


def test_ufo_reward_decays_by_half_per_attempt_and_feedback_is_unary() -> None:
    env = TryAgain(ArithmeticEnv())
    observation, info = env.reset(seed=1)
    task = info["task_id"]
    assert "What is" in observation and info["stop"] == ["</answer>"]
    expected = right(env)
    observation, reward, terminated, truncated, info = env.step(answer(expected + 1))
    assert observation.startswith("Incorrect. Please think again.") and (reward, terminated, truncated) == (0.0, False, False)
    assert right(env) == expected, "a new attempt is at the same task"
    observation, reward, terminated, truncated, info = env.step(answer(expected + 2))
    observation, reward, terminated, truncated, info = env.step(answer(expected))
    assert terminated and not truncated and observation == ""
    assert reward == pytest.approx(0.5**2)  # right at attempt t = 2
    assert info["metrics"]["attempts"] == 3 and info["metrics"]["success"] == 1.0
    assert info["metrics"]["distinct_answer_fraction"] == 1.0
    assert math.isclose(reward, sum(info["reward_components"].values()))
    assert env.reset(seed=1)[1]["task_id"] == task


def test_a_reset_the_inner_env_refuses_leaves_the_episode_and_its_next_attempts_as_they_were() -> None:
    class Strict(ArithmeticEnv):
        reset_options = frozenset()  # reads none: any option is refused

    env = TryAgain(Strict())
    env.reset(seed=1)
    expected = right(env)
    with pytest.raises(ValueError, match="takes no reset option 'bogus'"):
        env.reset(seed=2, options={"bogus": 1})
    observation, *_ = env.step(answer(expected + 1))  # wrong: the next attempt resets the inner env again
    assert observation.startswith("Incorrect.") and right(env) == expected  # seed 1's task, not seed 2's
    _, reward, terminated, _, _ = env.step(answer(expected))
    assert terminated and reward == pytest.approx(0.5)


def test_repeated_answers_are_penalised_at_the_end() -> None:
    env = TryAgain(ArithmeticEnv(), max_attempts=4, repetition_lambda=0.5)
    env.reset(seed=2)
    wrong = right(env) + 3
    for text in (answer(wrong), answer(f"  {wrong} "), answer(wrong + 1)):
        assert env.step(text)[1] == 0.0
    _, _, terminated, truncated, info = env.step(answer(wrong + 1))
    # Four wrong answers, two distinct: penalty 0.5 * (1 - 2/4); attempts exhausted: truncated.
    assert truncated and not terminated
    assert info["reward_components"] == {"success": 0.0, "repetition_penalty": pytest.approx(-0.25)}
    assert info["metrics"]["distinct_answer_fraction"] == 0.5
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(answer(wrong))


def test_an_attempt_without_an_answer_counts_and_invalid_turns_pass_through() -> None:
    env = TryAgain(ArithmeticEnv(max_turns=2), max_attempts=2, format_penalty=0.1)
    env.reset(seed=3)
    observation, reward, terminated, _, info = env.step("no tags")
    assert observation.startswith("Put your answer") and info["invalid_action"] and not terminated
    assert reward == pytest.approx(-0.1)
    observation, reward, terminated, truncated, info = env.step("still none")  # the inner env truncates
    assert observation.startswith("Incorrect. Please think again.") and not (terminated or truncated)
    assert info["metrics"]["answers"] == 0.0 and info["attempt"] == 1
    _, reward, terminated, _, _ = env.step(answer(right(env)))
    assert terminated and reward == pytest.approx(0.5)


def test_without_info_correct_the_terminal_reward_decides() -> None:
    env = TryAgain(ArithmeticEnv(report_correct=False), restate_task=False)
    env.reset(seed=4)
    assert env.step(answer(right(env) + 1))[2] is False
    _, reward, terminated, _, _ = env.step(answer(right(env)))
    assert terminated and reward == pytest.approx(0.5)


def test_multi_attempt_announces_the_budget_and_scores_the_outcome() -> None:
    env = MultiAttempt(ArithmeticEnv(), attempts=2)
    _, info = env.reset(seed=5)
    assert info["system_prompt"].endswith("You have 2 attempts to answer the question.")
    observation, reward, terminated, _, _ = env.step(answer(right(env) + 1))
    assert observation.startswith("Your answer is incorrect. You have 1 attempt left. Try an alternative.")
    assert (reward, terminated) == (0.0, False)
    _, reward, terminated, truncated, _ = env.step(answer(right(env) + 1))
    assert terminated and not truncated and reward == -0.5

    env.reset(seed=5)
    for _ in range(4):  # two attempts without any answer
        _, reward, terminated, _, _ = env.step("I do not know")
    assert terminated and reward == -1.0

    discounted = MultiAttempt(ArithmeticEnv(), attempts=3, discount=0.5)
    discounted.reset(seed=6)
    discounted.step(answer(right(discounted) + 1))
    _, reward, terminated, _, _ = discounted.step(answer(right(discounted)))
    assert terminated and reward == 0.5


def test_multi_attempt_draws_the_budget_per_episode_from_the_seed() -> None:
    env = MultiAttempt(ArithmeticEnv(), max_attempts=5)
    budgets = [env.reset(seed=seed)[1]["attempts"] for seed in range(40)]
    assert set(budgets) == {1, 2, 3, 4, 5}
    assert budgets == [env.reset(seed=seed)[1]["attempts"] for seed in range(40)]


@pytest.mark.parametrize("wrapper", [TryAgain, MultiAttempt])
@given(actions=st.lists(hostile_text(), min_size=1, max_size=6), seed=st.integers(0, 2**16))
def test_wrappers_survive_arbitrary_text_and_always_end(wrapper, actions: list[str], seed: int) -> None:
    env = wrapper(ArithmeticEnv())
    env.reset(seed=seed)
    for turn in range(env.max_turns):
        observation, reward, terminated, truncated, info = env.step(actions[turn % len(actions)])
        assert isinstance(observation, str) and math.isfinite(reward)
        assert math.isclose(reward, sum(info["reward_components"].values()), abs_tol=1e-12)
        assert {"reward_components", "invalid_action", "metrics"} <= info.keys()
        if terminated or truncated:
            break
    else:
        pytest.fail("the wrapped episode did not end within max_attempts * max_turns")


def test_the_envs_reported_verdict_beats_a_positive_reward_for_a_wrong_answer() -> None:
    # Search-R1's format-aware reward gives a well-formed wrong answer 0.2: the metrics say it is wrong.
    env = TryAgain(gym.make("rl-llm/Search-v0", reward="em_format"), max_attempts=2)
    env.reset(seed=0)
    task = env.unwrapped.current_task
    env.step(f"<think>look it up</think>\n<search>{task.oracle_queries[0]}</search>")
    observation, reward, terminated, _, info = env.step("<think>a guess</think>\n<answer>nobody</answer>")
    assert info["inner_reward_components"]["em_format"] > 0 and info["metrics"]["correct"] == 0.0
    assert observation.startswith("Incorrect. Please think again.") and (reward, terminated) == (0.0, False)
    assert info["metrics"]["success"] == 0.0


# -- regression tests of issue 16 (environment fidelity) ------------------------------------------------------


@pytest.mark.parametrize("wrapper", [TryAgain, MultiAttempt])
def test_a_new_attempt_reshows_the_first_observation(wrapper) -> None:
    # As O the agent's first observation holds the opponent's opening move; the next attempt starts from the
    # same position, which the agent must see again (before: only "Incorrect. Please think again.").
    kwargs = {"attempts": 2} if wrapper is MultiAttempt else {}
    env = wrapper(gym.make("rl-llm/TicTacToe-v0", agent_mark="O", opponent="minimax", max_illegal_moves=0), **kwargs)
    first, _ = env.reset(seed=0)
    opening = re.search(r"opponent played ([A-C][1-3])", first)
    assert opening is not None, "as O the first observation shows the opponent's opening move"
    taken = opening[1]
    observation, _, terminated, truncated, _ = env.step(f"<move>{taken}</move>")  # illegal: loses at once
    assert not (terminated or truncated)
    assert observation.startswith(env.feedback if wrapper is TryAgain else "Your answer is incorrect.")
    assert "starts again from the beginning" in observation and observation.endswith(first)


def test_restate_task_false_gives_the_unary_feedback_alone() -> None:
    env = TryAgain(ArithmeticEnv(), restate_task=False)
    env.reset(seed=1)
    assert env.step(answer(right(env) + 1))[0] == "Incorrect. Please think again."


def test_repeated_answers_are_normalised_as_exact_match_does() -> None:
    env = TryAgain(ArithmeticEnv(), max_attempts=4)
    env.reset(seed=2)
    for text in ("Paris", "Paris.", "paris!"):
        env.step(answer(text))
    _, _, _, truncated, info = env.step(answer("-7"))
    # Four answers, two distinct ("paris" and -7): penalty 0.5 * (1 - 2/4).
    assert truncated and info["metrics"]["distinct_answer_fraction"] == 0.5
    assert info["reward_components"]["repetition_penalty"] == pytest.approx(-0.25)
    assert normalise_answer("-4") != normalise_answer("4") and normalise_answer("1,000") == normalise_answer("1000.0")


def _episode_return(env: gym.Env, turn: str, seed: int) -> float:
    env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        _, reward, terminated, truncated, _ = env.step(turn)
        total, done = total + reward, terminated or truncated
    return total


@pytest.mark.parametrize("make_inner", [lambda: ArithmeticEnv(max_turns=1), lambda: ArithmeticEnv(max_turns=2)])
def test_turns_without_an_answer_never_beat_repeating_a_wrong_answer(make_inner) -> None:
    # Before: no format penalty by default, so 5 garbage turns (0.0) beat 5 identical wrong answers (-0.4).
    garbage = _episode_return(TryAgain(make_inner()), "I refuse to answer", seed=3)
    repeated = _episode_return(TryAgain(make_inner()), answer(-1), seed=3)
    assert repeated == pytest.approx(-0.4)
    assert garbage < repeated
    assert TryAgain(ArithmeticEnv()).format_penalty == 0.1


def test_render_shows_the_feedback_the_agent_saw() -> None:
    env = TryAgain(ArithmeticEnv())
    _, info = env.reset(seed=4)
    feedback, *_ = env.step(answer(right(env) + 1))
    env.step(answer(right(env)))
    text = env.render()
    assert feedback in text and text.count(info["system_prompt"]) == 1
    assert text.index(answer(right(env) + 1)) < text.index(feedback) < text.rindex(answer(right(env)))


def test_multi_attempt_render_shows_its_system_prompt_and_feedback() -> None:
    env = MultiAttempt(ArithmeticEnv(), attempts=2)
    _, info = env.reset(seed=5)
    feedback, *_ = env.step(answer(right(env) + 1))
    assert env.render().startswith(f"[system]\n{info['system_prompt']}") and feedback in env.render()


def test_terminal_agent_is_told_the_workspace_was_reset() -> None:
    from tests.conftest import sandbox_problem

    if (problem := sandbox_problem()) is not None:
        pytest.skip(f"Terminal-v0 needs an isolating sandbox: {problem}")
    env = TryAgain(gym.make("rl-llm/Terminal-v0", max_turns=2, command_timeout_s=5.0, difficulty=1), max_attempts=2)
    try:
        first, _ = env.reset(seed=0)
        observation, reward, terminated, truncated, _ = env.step("<action>done</action>")  # the check fails
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert "everything was reset" in observation and observation.endswith(first)
    finally:
        env.close()
