"""An env that returns what the rollout engine cannot record (a NaN or infinite reward, a reward or metric that
is not a number, an observation that is not text) fails its own episode with a message naming the call and the
value; the other episodes go on (agents/env_output.py). Before, a NaN reward was recorded as is (and trained
on: the next update made every weight NaN) and the others raised out of the whole rollout."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import pytest

from rl_llm.agents.env_output import game_problem, step_problem
from rl_llm.agents.evaluate import evaluate
from rl_llm.agents.policy import TextPolicy

BAD_STEPS: dict[int, tuple[Any, Any, dict[str, Any]]] = {  # seed -> (observation, reward, info) of its 2nd step
    1: ("ok", math.nan, {}),
    2: ("ok", math.inf, {}),
    3: ("ok", "1.0", {}),
    4: (None, 1.0, {}),
    5: ("ok", 1.0, {"metrics": {"accuracy": "high"}}),
    6: ("ok", 1.0, []),
}
ERRORS = {
    1: "env.step returned a reward of nan (rewards must be finite)",
    2: "env.step returned a reward of inf (rewards must be finite)",
    3: "env.step returned a reward that is not a number: '1.0'",
    4: "env.step returned an observation that is not text: NoneType",
    5: "env.step returned an info['metrics'] that is not a dict of numbers: {'accuracy': 'high'}",
    6: "env.step returned an info that is not a dict: list",
}


class SometimesBadEnv(gym.Env):
    """Two steps of reward 1; the seed picks what the second step gets wrong (seed 0: nothing)."""

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        self.seed_, self.turn = seed, 0
        return "Say anything.", {}

    def step(self, action: str) -> tuple[Any, Any, bool, bool, Any]:
        self.turn += 1
        if self.turn == 2 and self.seed_ in BAD_STEPS:
            observation, reward, info = BAD_STEPS[self.seed_]
            return observation, reward, True, False, info
        return "Again.", 1.0, self.turn >= 2, False, {"metrics": {"accuracy": 1}}


class Echo(TextPolicy):
    def respond(self, conversation: list) -> str:
        return "hello"


def test_each_bad_step_fails_its_episode_only_with_a_message_naming_it() -> None:
    trajectories = evaluate(SometimesBadEnv, Echo(), 7, seed=0, batch_size=3)
    by_seed = {t.seed: t for t in trajectories}
    assert by_seed[0].error is None and by_seed[0].total_reward == 2.0 and by_seed[0].end_reason == "terminated"
    for seed, message in ERRORS.items():
        trajectory = by_seed[seed]
        assert trajectory.end_reason == "error" and trajectory.error == message, trajectory.error
        assert len(trajectory.turns) == 1 and trajectory.total_reward == 1.0  # the good first step is kept
        assert all(math.isfinite(turn.reward) for turn in trajectory.turns)


def test_numbers_of_every_kind_pass() -> None:
    import numpy as np

    for reward in (1, 0.5, True, np.float32(0.25), np.int64(-3)):
        assert step_problem("obs", reward, {"metrics": {"n": np.float64(1.0)}}) is None
    assert step_problem("obs", -1e300, {}) is None


@pytest.mark.parametrize(("args", "problem"), [
    (({"a": "x"}, {"a": {}}), "no observation or info for player 'b'"),
    (({"a": "x", "b": "y"}, {"a": {}, "b": {}}, {"a": math.nan}), "a reward for 'a' of nan"),
    (({"a": "x", "b": 3}, {"a": {}, "b": {}}, {}), "an observation for 'b' that is not text: int"),
    (({"a": "x", "b": "y"}, {"a": {}, "b": {}}, {}, None), "terminations or truncations that are not a dict"),
    ((["x", "y"], {}), "observations that are not a dict keyed by player: list"),
])  # fmt: skip
def test_a_games_outputs_are_checked_for_every_player(args: tuple, problem: str) -> None:
    found = game_problem(["a", "b"], *args)
    assert found is not None and found.startswith(problem), found
    assert game_problem(["a", "b"], {"a": "x", "b": "y"}, {"a": {}, "b": {}}, {"b": 2}, {}, {"a": True}) is None
