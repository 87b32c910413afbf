"""``check_text_env`` on small hand-written envs: the one in docs/writing-an-environment.md passes, a plain
``gym.Env`` written without ``TextEnv`` passes, and each deliberately broken variant is caught with an error
that names the broken rule."""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym
import pytest

from rl_llm.envs import EnvContractError, Outcome, Task, TextEnv, UnicodeText, check_episode, check_text_env
from rl_llm.envs.checker import RULES, hostile_actions
from rl_llm.envs.parsing import extract_tag
from rl_llm.envs.wrappers import MultiAttempt, TryAgain

# These envs are built directly, not through gym.make: Gymnasium's checker then says it cannot try other modes.
pytestmark = pytest.mark.filterwarnings("ignore:.*Not able to test alternative render modes")


class GuessNumberEnv(TextEnv):
    """The example of docs/writing-an-environment.md: guess a number from 1 to 100, told higher or lower."""

    stop = ("</guess>",)

    def __init__(self, max_turns: int = 7, render_mode: str | None = None) -> None:
        super().__init__(max_turns=max_turns, render_mode=render_mode)

    def _reset(self, options: dict[str, Any]) -> Task:
        self.secret = int(options.get("secret", self.np_random.integers(1, 101)))
        return Task(
            observation="I am thinking of a number from 1 to 100. Guess it.",
            task_id=f"guess-{self.secret}",
            system_prompt="Reply with one guess inside <guess>...</guess>, e.g. <guess>50</guess>.",
        )

    def _step(self, action: str) -> Outcome:
        guess = (extract_tag(action, "guess", last=True) or "").strip()
        if not (guess.isascii() and guess.isdigit() and len(guess) <= 3):  # "²".isdigit(), int("9" * 5000) fail
            return Outcome("Put one whole number inside <guess>...</guess>.", {"format": -0.1}, invalid_action=True)
        value = int(guess)
        if value == self.secret:
            return Outcome("Correct!", {"correct": 1.0}, terminated=True, metrics={"guesses": float(self.turn)})
        hint = "higher" if value < self.secret else "lower"
        return Outcome(f"{value} is wrong: go {hint}.", {"correct": 0.0}, metrics={"guesses": float(self.turn)})


class PlainEnv(gym.Env):
    """The contract by hand, without TextEnv: say "stop" inside <say></say> (any other text is invalid)."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}

    def __init__(self, max_turns: int = 4) -> None:
        self.max_turns = max_turns
        self.render_mode = None
        self.observation_space = UnicodeText(1 << 20)
        self.action_space = UnicodeText(1 << 20)
        self.ended = True
        self.lines: list[str] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.word = str(self.np_random.choice(["stop", "halt", "end"]))
        self.turn, self.ended = 0, False
        self.lines = [f"Say {self.word!r} inside <say></say>."]
        return self.lines[0], {"system_prompt": "Follow the instruction.", "task_id": self.word, "stop": ["</say>"]}

    def step(self, action: str):
        if self.ended:
            raise RuntimeError("the episode has ended; call reset()")
        if not isinstance(action, str):
            raise TypeError(f"an action is a str, got {type(action).__name__}")
        self.turn += 1
        self.lines.append(action)
        said = extract_tag(action, "say", last=True)
        invalid = said is None
        terminated = said is not None and said.strip() == self.word
        truncated = not terminated and self.turn >= self.max_turns
        self.ended = terminated or truncated
        components = {"said": 1.0 if terminated else 0.0, "format": -0.5 if invalid else 0.0}
        observation = "" if self.ended else ("Use <say></say>." if invalid else "Not that word.")
        info = {"reward_components": components, "invalid_action": invalid, "metrics": {}}
        return observation, float(sum(components.values())), terminated, truncated, info

    def render(self) -> str:
        return "\n".join(self.lines)


def quietly_check(env: gym.Env, **kwargs: Any) -> None:
    """check_text_env without Gymnasium's render check printing transcripts into the test log."""
    with contextlib.redirect_stdout(None):
        check_text_env(env, **kwargs)


@pytest.mark.parametrize("make", [GuessNumberEnv, PlainEnv])
def test_envs_that_follow_the_contract_pass(make) -> None:
    quietly_check(make())
    quietly_check(make(), seed=7, fuzz_episodes=1)


def test_the_example_in_the_docs_runs_and_passes() -> None:
    """docs/writing-an-environment.md's first code block: the env above, checked."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "writing-an-environment.md").read_text(encoding="utf-8")
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert "class GuessNumberEnv(TextEnv)" in block and "check_text_env(GuessNumberEnv())" in block
    with contextlib.redirect_stdout(None):
        exec(compile(block, "writing-an-environment.md", "exec"), {"__name__": "docs_example"})


def test_a_single_turn_env_passes() -> None:
    """Its invalid turn is truncated at once, as the contract says (Gymnasium's checker would object)."""
    quietly_check(GuessNumberEnv(max_turns=1))


def test_the_example_env_plays_as_documented() -> None:
    env = GuessNumberEnv()
    observation, info = env.reset(seed=0, options={"secret": 42})
    assert info["task_id"] == "guess-42" and info["stop"] == ["</guess>"]
    observation, reward, *_ = env.step("<guess>50</guess>")
    assert observation == "50 is wrong: go lower." and reward == 0.0
    observation, reward, terminated, truncated, info = env.step("<guess>42</guess>")
    assert (observation, reward, terminated, truncated) == ("", 1.0, True, False)
    assert "<guess>42</guess>" in env.render()


# -- broken envs, one rule each ---------------------------------------------------------------------------


class RewardNotTheSum(GuessNumberEnv):
    def step(self, action: str):
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, reward + 0.5, terminated, truncated, info


class EndsOnInvalidAction(GuessNumberEnv):
    def _step(self, action: str) -> Outcome:
        outcome = super()._step(action)
        outcome.terminated = outcome.terminated or outcome.invalid_action
        return outcome


class TaskIdNotSeeded(GuessNumberEnv):
    counter = itertools.count()

    def _reset(self, options: dict[str, Any]) -> Task:
        task = super()._reset(options)
        task.task_id = f"{task.task_id}-{next(self.counter)}"
        return task


class ObservationNotSeeded(GuessNumberEnv):
    counter = itertools.count()

    def _reset(self, options: dict[str, Any]) -> Task:
        task = super()._reset(options)
        task.observation = f"{task.observation} (episode {next(self.counter)})"
        return task


class EpisodeNotSeeded(GuessNumberEnv):
    """Same task, but the hints depend on a global random stream, not on the seed."""

    counter = itertools.count()

    def _step(self, action: str) -> Outcome:
        outcome = super()._step(action)
        outcome.observation += " ." * (next(self.counter) % 3)
        return outcome


class MissingStop(GuessNumberEnv):
    def reset(self, *, seed=None, options=None):
        observation, info = super().reset(seed=seed, options=options)
        del info["stop"]
        return observation, info


class MissingMetrics(GuessNumberEnv):
    def step(self, action: str):
        observation, reward, terminated, truncated, info = super().step(action)
        del info["metrics"]
        return observation, reward, terminated, truncated, info


class IntegerReward(GuessNumberEnv):
    def step(self, action: str):
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, int(reward), terminated, truncated, info


class TalksAfterTheEnd(GuessNumberEnv):
    def step(self, action: str):
        observation, reward, terminated, truncated, info = super().step(action)
        return observation or "bye", reward, terminated, truncated, info


class SilentOnInvalid(GuessNumberEnv):
    def _step(self, action: str) -> Outcome:
        outcome = super()._step(action)
        if outcome.invalid_action:
            outcome.observation = ""
        return outcome


class CrashesOnLongActions(GuessNumberEnv):
    def _step(self, action: str) -> Outcome:
        if len(action) > 100_000:
            raise ValueError("action too long")
        return super()._step(action)


class CrashesOnUnicode(GuessNumberEnv):
    def _step(self, action: str) -> Outcome:
        action.encode("ascii")
        return super()._step(action)


class AlphanumericSpaces(GuessNumberEnv):
    def __init__(self) -> None:
        super().__init__()
        self.action_space = gym.spaces.Text(1 << 20)


class AcceptsTokenIds(PlainEnv):
    def step(self, action):
        return super().step(str(action))


class NeverEnds(PlainEnv):
    def step(self, action):
        observation, reward, terminated, _, info = super().step(action)
        self.ended = terminated
        return observation or "go on", reward, terminated, False, info


class KeepsGoingAfterTheEnd(PlainEnv):
    def step(self, action):
        self.ended = False
        return super().step(action)


class TranscriptWithoutActions(GuessNumberEnv):
    def render(self) -> str:
        return "a transcript"


@pytest.mark.parametrize(
    ("make", "rule"),
    [
        (RewardNotTheSum, "reward-components-sum"),
        (EndsOnInvalidAction, "invalid-action-continues"),
        (TaskIdNotSeeded, "reset-deterministic"),
        (ObservationNotSeeded, "reset-deterministic"),
        (EpisodeNotSeeded, "same-seed-same-episode"),
        (MissingStop, "reset-info-keys"),
        (MissingMetrics, "step-info-keys"),
        (IntegerReward, "step-returns-five-tuple"),
        (TalksAfterTheEnd, "empty-observation-at-end"),
        (SilentOnInvalid, "corrective-observation"),
        (CrashesOnLongActions, "survives-hostile-actions"),
        (CrashesOnUnicode, "survives-hostile-actions"),
        (AlphanumericSpaces, "spaces-accept-any-text"),
        (AcceptsTokenIds, "text-actions-only"),
        (NeverEnds, "ends-within-max-turns"),
        (KeepsGoingAfterTheEnd, "step-after-end-raises"),
        (TranscriptWithoutActions, "render-returns-transcript"),
    ],
)
def test_a_broken_env_is_caught_naming_the_rule(make, rule: str) -> None:
    with pytest.raises(EnvContractError, match=rf"^\[{rule}\] {make.__name__}: ") as caught:
        quietly_check(make())
    assert caught.value.rule == rule and RULES[rule] in str(caught.value)
    assert isinstance(caught.value, AssertionError)  # pytest and check_env-style callers treat it as a failure


@pytest.mark.parametrize("wrapper", [TryAgain, MultiAttempt])
def test_a_wrapped_env_is_checked_through_its_wrappers(wrapper) -> None:
    """The wrapper's own turn limit applies (several attempts), and errors name the whole chain."""
    quietly_check(wrapper(GuessNumberEnv(max_turns=2)))
    with pytest.raises(EnvContractError, match=rf"^\[survives-hostile-actions\] {wrapper.__name__}\(CrashesOnUnicode\): "):
        quietly_check(wrapper(CrashesOnUnicode(max_turns=2)))


def test_the_gymnasium_checker_runs_as_a_rule() -> None:
    class BadSeeding(GuessNumberEnv):
        def reset(self, *, seed=None, options=None):  # ignores the seed: Gymnasium's check_env notices
            return super().reset(seed=None if seed is None else 0, options=options)

    with pytest.raises(EnvContractError, match=r"^\[gymnasium-check-env\]"):
        quietly_check(BadSeeding())


def test_check_episode_checks_the_actions_given() -> None:
    check_episode(GuessNumberEnv(), ["<guess>1</guess>", "nonsense"], seed=0)
    with pytest.raises(EnvContractError, match=r"^\[survives-hostile-actions\]"):
        check_episode(CrashesOnUnicode(), ["<guess>é</guess>"], seed=0)
    with pytest.raises(ValueError, match="at least one action"):
        check_episode(GuessNumberEnv(), [], seed=0)


def test_the_fuzz_is_deterministic_and_hostile() -> None:
    actions = hostile_actions(5, count=10, stop=["</guess>"])
    assert actions == hostile_actions(5, count=10, stop=["</guess>"])
    assert actions != hostile_actions(6, count=10, stop=["</guess>"])
    assert any(len(action) > 10_000 for action in actions)
    assert any(not action.isascii() for action in actions)
    assert any("</guess>" in action for action in hostile_actions(5, count=40, stop=["</guess>"]))
