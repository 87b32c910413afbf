"""Contract tests run against every registered environment (docs/design.md#the-environment-contract).

The rules live in ``rl_llm.envs.check_text_env`` (envs/checker.py), the checker users run on their own envs;
here it runs on every registered env, hypothesis feeds ``check_episode`` more hostile episodes, and the
agents' baselines check seeding. A newly registered environment is covered automatically. Environments that
need arguments to run quickly in tests list them in ``TEST_KWARGS``.
"""

from __future__ import annotations

import gymnasium as gym
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rl_llm  # noqa: F401
from rl_llm.agents.baselines import baselines_for, make_baseline
from rl_llm.agents.evaluate import evaluate, transcript
from rl_llm.envs import check_episode, check_text_env
from rl_llm.envs.math.problems import reasoning_gym_import_error
from rl_llm.envs.registration import env_ids
from tests.conftest import hostile_text

TEST_KWARGS: dict[str, dict] = {
    # Short episodes and commands keep the fuzz (one sandbox per example) quick; level 1 fits the oracle in 6 turns.
    "rl-llm/Terminal-v0": {"max_turns": 6, "command_timeout_s": 5.0, "difficulty": 1},
}


def make(env_id: str) -> gym.Env:
    if env_id == "rl-llm/Math-v0" and (missing := reasoning_gym_import_error()) is not None:
        pytest.skip(f"needs {missing}")
    return gym.make(env_id, **TEST_KWARGS.get(env_id, {}))


ALL_ENVS = pytest.mark.parametrize("env_id", env_ids())


@ALL_ENVS
def test_check_text_env_passes(env_id: str) -> None:
    """Every rule of the contract, Gymnasium's check_env and a deterministic hostile fuzz (megabyte action)."""
    env = make(env_id)
    check_text_env(env, seed=3)
    env.close()


@ALL_ENVS
@given(actions=st.lists(hostile_text(), min_size=1, max_size=8), seed=st.integers(0, 2**16))
def test_survives_arbitrary_text_for_whole_episodes(env_id: str, actions: list[str], seed: int) -> None:
    env = make(env_id)
    check_episode(env, actions, seed=seed)  # every step against the contract, the end within max_turns
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("after the end")
    env.close()


def _play(env_id: str, seed: int) -> tuple[list[str], list[float]]:
    """Transcripts and returns of 3 episodes with the env's first baseline (or fixed texts)."""
    names = baselines_for(env_id)
    if names:
        policy = make_baseline(names[0], env_id, seed=seed)
        trajectories = evaluate(lambda: make(env_id), policy, 3, seed=seed)
        return [transcript(t) for t in trajectories], [t.total_reward for t in trajectories]
    env = make(env_id)
    env.reset(seed=seed)
    rewards, done = [], False
    while not done:
        _, reward, terminated, truncated, _ = env.step("<answer>42</answer>")
        rewards.append(reward)
        done = terminated or truncated
    return [env.unwrapped.transcript], rewards


@ALL_ENVS
def test_same_seed_gives_identical_transcripts_and_rewards(env_id: str) -> None:
    first, second = _play(env_id, seed=11), _play(env_id, seed=11)
    assert first == second
    other = _play(env_id, seed=12)
    assert other[0] != first[0], "different seeds should give different episodes"


@ALL_ENVS
def test_step_rejects_non_text_actions(env_id: str) -> None:
    env = make(env_id)
    env.reset(seed=0)
    with pytest.raises(TypeError, match="as str"):  # what TextEnv says; the checker only asks for a TypeError
        env.unwrapped.step(123)
    env.close()


@pytest.mark.parametrize("env_id", env_ids())
def test_an_option_the_env_does_not_take_is_one_clear_error(env_id: str) -> None:
    from rl_llm.envs.registration import EnvFactory

    with pytest.raises(ValueError, match=rf"^{env_id} takes no option 'no_such_option'; its options are \w"):
        EnvFactory(env_id, no_such_option=1)()


@ALL_ENVS
def test_a_reset_option_the_env_does_not_read_is_refused_and_the_episode_goes_on(env_id: str) -> None:
    """Every shipped env says which reset options it reads; any other key (a misspelt option) is one clear
    ValueError naming them, raised before the env changes: the running episode goes on as if nothing came."""
    from rl_llm.envs.registration import declared_reset_options

    takes = declared_reset_options(env_id)
    if env_id.startswith("rl-llm/"):
        assert takes is not None, f"{env_id} does not declare its reset options"
    if takes is None:
        pytest.skip(f"{env_id} passes every reset option through")
    env = make(env_id)
    env.reset(seed=5)
    expected = rf"takes no reset option 'no_such_option'; its reset options are {', '.join(sorted(takes)) or 'none'}$"
    with pytest.raises(ValueError, match=expected):
        env.reset(seed=6, options={"no_such_option": 1})
    alone = make(env_id)
    alone.reset(seed=5)
    action = "<answer>42</answer>"
    assert env.step(action)[:4] == alone.step(action)[:4]  # the seed-5 episode, untouched by the refusal
    env.close()
    alone.close()


def test_constructor_options_are_read_once_and_unhashable_constructors_still_read() -> None:
    from rl_llm.envs.registration import _cached_options, constructor_options

    class Maker:  # a callable with __eq__ and no __hash__: cannot be a cache key
        __hash__ = None  # type: ignore[assignment]

        def __call__(self, *, size: int = 3, colour: str = "red") -> None: ...

    def flexible(a: int, **rest: object) -> None: ...

    assert constructor_options(Maker()) == ("size", "colour")
    assert constructor_options(flexible) is None  # takes **kwargs: any option passes to the env itself
    before = _cached_options.cache_info().hits
    assert constructor_options(flexible) is None and _cached_options.cache_info().hits == before + 1


def test_equal_env_factories_hash_alike() -> None:
    """Python's rule for dict keys and set members: equal objects hash alike. Factories are equal by value
    (1 == 1.0 == True), and their hash once dumped the values as JSON, which tells 1 from 1.0."""
    from rl_llm.envs.registration import EnvFactory

    same = [EnvFactory("rl-llm/MultiArmedBandit-v0", horizon=h) for h in (10, 10.0)]
    assert same[0] == same[1] and hash(same[0]) == hash(same[1]) and len(set(same)) == 1
    assert len({EnvFactory("rl-llm/MultiArmedBandit-v0", horizon=5), same[0]}) == 2
    assert len({EnvFactory("rl-llm/MultiArmedBandit-v0", horizon=[1], flag=True), same[0]}) == 2  # unhashable values too
