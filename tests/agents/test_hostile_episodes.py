"""An env, agent or token backend of the user's that misbehaves fails its own episode, named in
``trajectory.error``; it no longer stops the whole rollout (every other episode lost with it), nor slips bad
data into the trajectories. Found by a red-team sweep of the rollout engine."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from transformers import AutoTokenizer

from rl_llm.agents import rollout
from rl_llm.agents.evaluate import evaluate
from rl_llm.agents.llm import LLMPolicy, SamplingParams
from rl_llm.agents.policy import Completion, EpisodeAgent, Policy, TextPolicy
from rl_llm.agents.rollout import collect_games
from rl_llm.agents.tiny import tiny_model
from rl_llm.types import Trajectory


class Scripted(gym.Env):
    """Two steps of "obs" and reward 1, unless ``reset``/``step`` say otherwise."""

    def __init__(self, reset: Callable[[], Any] | None = None, step: Callable[[int], Any] | None = None) -> None:
        self._reset, self._step, self.t = reset, step, 0

    def reset(self, seed: int | None = None, options: dict | None = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        return self._reset() if self._reset else ("hello", {"stop": ["</a>"], "task_id": "t"})

    def step(self, action: str) -> Any:
        self.t += 1
        return self._step(self.t) if self._step else ("obs", 1.0, self.t >= 2, False, {})


class Says(TextPolicy):
    name = "says"

    def __init__(self, answer: Any = "x</a>") -> None:
        self.answer = answer

    def respond(self, conversation: Any) -> Any:
        return self.answer


def play(env: Callable[[], gym.Env], policy: Any, episodes: int = 2) -> list[Trajectory]:
    return evaluate(env, policy, episodes, seed=0)


@pytest.mark.parametrize(("step", "error"), [
    (lambda t: ("o", 1.0, np.array([True, False]), False, {}), "a terminated that is not a bool"),
    (lambda t: ("o", 1.0, "False", False, {}), "a terminated that is not a bool: 'False'"),  # was true
    (lambda t: ("o", 1.0, False, None, {}), "a truncated that is not a bool: None"),
    (lambda t: ("o", 1.0, True, False, {"invalid_action": np.array([1, 0])}), r"an info\['invalid_action'\] that is"),
])  # fmt: skip
def test_a_step_flag_that_is_no_bool_fails_its_episode_only(step: Callable, error: str) -> None:
    """An array raised "the truth value of an array is ambiguous" out of the whole rollout."""
    trajectories = play(lambda: Scripted(step=step), Says())
    assert len(trajectories) == 2 and all(t.end_reason == "error" for t in trajectories)
    assert all(t.error is not None and re.search(error, t.error) for t in trajectories), trajectories[0].error


@pytest.mark.parametrize(("reset", "error"), [
    (lambda: ("hi", {"stop": 5}), r"an info\['stop'\] that is not a list of str: 5"),  # "'int' is not iterable"
    (lambda: ("hi", {"stop": "</a>"}), r"an info\['stop'\] that is not a list of str: '</a>'"),  # four stops
    (lambda: ("hi", {"system_prompt": 5}), r"an info\['system_prompt'\] that is not text: int"),
])  # fmt: skip
def test_a_reset_info_the_engine_cannot_use_fails_its_episode_only(reset: Callable, error: str) -> None:
    trajectories = play(lambda: Scripted(reset=reset), Says())
    assert all(t.end_reason == "error" and re.search(error, t.error or "") for t in trajectories)


def test_an_agents_end_hook_that_raises_fails_its_episode_only() -> None:
    class Ends(EpisodeAgent):
        def act(self, conversation: Any) -> str:
            return "x</a>"

        def end(self, trajectory: Trajectory) -> None:
            raise ZeroDivisionError("division by zero")

    class Starts(Policy):
        name = "starts"

        def start_episode(self, episode: Any) -> EpisodeAgent:
            return Ends()

    trajectories = play(lambda: Scripted(), Starts(), episodes=3)  # raised out of evaluate before
    assert [t.error for t in trajectories] == ["agent.end failed: ZeroDivisionError: division by zero"] * 3
    assert all(len(t.turns) == 2 for t in trajectories)  # the episode itself is kept as played


def test_a_completion_whose_text_is_no_str_fails_its_episode() -> None:
    """Completion(None) reached env.step, and Completion(123) was written to the trajectory as the action."""
    for answer in (Completion(None), Completion(123)):  # type: ignore[arg-type]
        trajectories = play(lambda: Scripted(), Says(answer))
        assert all(t.end_reason == "error" and "a completion's text must be a str" in (t.error or "")
                   for t in trajectories)  # fmt: skip


class Tokens(LLMPolicy):
    """A token backend answering every request with ``make()``."""

    name = "tokens"

    def __init__(self, make: Callable[[], Completion]) -> None:
        super().__init__(SamplingParams(max_new_tokens=8))
        self.tokenizer = AutoTokenizer.from_pretrained(str(tiny_model()))
        self.make = make

    def generate(self, requests: Any) -> list[Completion]:
        return [self.make() for _ in requests]


@pytest.mark.parametrize(("ids", "logprobs", "error"), [
    ([11, 12, 13], [0.0], "3 token ids but 1 log-probs"),  # every later log-prob shifted, silently
    ([11, 12], [-0.5, float("nan")], "log-probs that are not all finite numbers"),  # NaN into the loss
    ([11, -5], [-0.5, -0.5], "token ids that are not all integers >= 0"),
])  # fmt: skip
def test_a_token_backends_misaligned_or_nan_record_fails_its_episode(ids: list, logprobs: list, error: str) -> None:
    trajectories = play(lambda: Scripted(), Tokens(lambda: Completion("x</a>", ids, logprobs, "stop")), episodes=1)
    assert trajectories[0].end_reason == "error" and error in (trajectories[0].error or "")
    good = play(lambda: Scripted(), Tokens(lambda: Completion("x</a>", [11, 12], [-0.5, -0.25], "stop")), 1)[0]
    assert good.error is None and len(good.token_ids) == len(good.logprobs) == len(good.token_roles)


def test_an_env_that_never_ends_is_stopped_with_a_named_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """No turn limit: the engine stepped it forever (20,000 steps in 8 s and counting), memory growing."""
    monkeypatch.setattr(rollout, "MAX_EPISODE_STEPS", 50)
    [trajectory] = play(lambda: Scripted(step=lambda t: ("o", 0.0, False, False, {})), Says(), episodes=1)
    assert len(trajectory.turns) == 50 and "did not end the episode within 50 steps" in (trajectory.error or "")


def test_a_games_agents_are_told_the_match_is_over() -> None:
    """end() is promised once per episode; in a two-player game it was never called."""
    ended: list[str | None] = []

    class Cooperates(EpisodeAgent):
        def act(self, conversation: Any) -> str:
            return "<A>"

        def end(self, trajectory: Trajectory) -> None:
            ended.append(trajectory.seat)

    class Starts(Policy):
        name = "starts"

        def start_episode(self, episode: Any) -> EpisodeAgent:
            return Cooperates()

    matches = collect_games("prisoners_dilemma_v0", Starts(), [0, 1])
    assert all(t.error is None for match in matches for t in match)
    assert sorted(ended) == ["player_0", "player_0", "player_1", "player_1"]
