"""PettingZoo API compliance, seeding and fuzzing of every game in rl_llm.envs.social."""

from __future__ import annotations

import math
import re
import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pettingzoo.test import api_test, parallel_api_test

from rl_llm.agents.baselines.social import SOCIAL_BASELINES
from rl_llm.agents.tournament import play_matches
from rl_llm.envs.social import GAMES, load
from rl_llm.envs.social.base import AGENTS, ObservationText
from tests.conftest import hostile_text

# Every game, and the second variant of Trust-and-Split.
CONFIGS = [(name, {}) for name in GAMES] + [("trust_and_split_v0", {"variant": "rps"})]
IDS = [name + "".join(f"-{v}" for v in kwargs.values()) for name, kwargs in CONFIGS]
ALL_GAMES = pytest.mark.parametrize(("game", "kwargs"), CONFIGS, ids=IDS)
INFO_KEYS = {"task_id", "seed", "active", "invalid_action", "metrics"}


@pytest.fixture(autouse=True)
def _quiet_pettingzoo_advice():
    """PettingZoo's API tests advise Box/Discrete spaces and NumPy observations; text games use neither."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(NumPy array|box or gymnasium.spaces.discrete).*")
        yield


@ALL_GAMES
def test_parallel_api_test_passes(game: str, kwargs: dict) -> None:
    parallel_api_test(load(game).parallel_env(**kwargs), num_cycles=1000)


@ALL_GAMES
def test_aec_api_test_passes(game: str, kwargs: dict) -> None:
    api_test(load(game).env(**kwargs), num_cycles=1000)


@ALL_GAMES
def test_reset_gives_rules_prompt_and_contract_infos(game: str, kwargs: dict) -> None:
    env = load(game).parallel_env(**kwargs)
    observations, infos = env.reset(seed=4)
    assert set(observations) == set(AGENTS) == set(infos)
    for agent in AGENTS:
        assert isinstance(observations[agent], ObservationText) and observations[agent]
        assert env.observation_space(agent).contains(observations[agent])
        assert INFO_KEYS | {"system_prompt", "stop"} <= infos[agent].keys()
        assert infos[agent]["task_id"] == infos[AGENTS[0]]["task_id"]
    assert any(infos[agent]["active"] for agent in AGENTS)
    # The rules come once: in the first observation only.
    first_line = observations[AGENTS[0]].splitlines()[0]
    actions = {agent: "not an action" for agent in env.agents}
    later, *_ = env.step(actions)
    acted = [agent for agent in AGENTS if infos[agent]["active"]]
    assert all(first_line not in later[agent] for agent in acted)


@ALL_GAMES
def test_same_seed_same_game_and_other_seeds_differ(game: str, kwargs: dict) -> None:
    def play(seed: int) -> tuple[list[str], list[tuple[float, float]]]:
        seats = tuple(SOCIAL_BASELINES[game]["random"](seed=index) for index in (1, 2))
        records = play_matches(game, seats, [seed, seed + 1], env_kwargs=kwargs, keep_transcripts=True)
        return [r.transcript for r in records], [r.returns for r in records]

    first = play(7)
    assert first == play(7)
    env = load(game).parallel_env(**kwargs)
    task_ids = {env.reset(seed=seed)[1][AGENTS[0]]["task_id"] for seed in range(5)}
    assert len(task_ids) == 5
    if game in ("split_v0", "trust_and_split_v0"):  # the values are drawn from the seed
        assert play(8)[0][0] != first[0][0]


@ALL_GAMES
def test_unseeded_resets_continue_the_seeded_sequence(game: str, kwargs: dict) -> None:
    def task_ids() -> list[str]:
        env = load(game).parallel_env(**kwargs)
        ids = [env.reset(seed=21)[1][AGENTS[0]]["task_id"]]
        ids += [env.reset()[1][AGENTS[0]]["task_id"] for _ in range(2)]
        return ids

    first = task_ids()
    assert first == task_ids() and len(set(first)) == 3


def _step_bound(game: str, env) -> int:
    if game == "tictactoe_v0":
        return 9 * (env.unwrapped.max_retries + 1)
    return env.num_rounds * 3 * (env.max_retries + 1)


@ALL_GAMES
@given(actions=st.lists(hostile_text(), min_size=1, max_size=6), seed=st.integers(0, 2**16))
def test_arbitrary_text_for_all_agents_never_breaks_a_game(
    game: str, kwargs: dict, actions: list[str], seed: int
) -> None:
    env = load(game).parallel_env(**kwargs, **({} if game == "tictactoe_v0" else {"num_rounds": 3}))
    observations, infos = env.reset(seed=seed)
    bound, step, returns = _step_bound(game, env), 0, dict.fromkeys(AGENTS, 0.0)
    while env.agents:
        step += 1
        assert step <= bound, f"game did not end within {bound} steps"
        chosen = {agent: actions[(step + i) % len(actions)] for i, agent in enumerate(env.agents)}
        observations, rewards, terminations, truncations, infos = env.step(chosen)
        for agent, observation in observations.items():
            assert isinstance(observation, str) and env.observation_space(agent).contains(observation)
        for agent, reward in rewards.items():
            assert math.isfinite(reward)
            returns[agent] += reward
        for agent in terminations:
            assert infos[agent].keys() >= INFO_KEYS
            assert isinstance(infos[agent]["invalid_action"], bool)
    assert all(terminations.values()) and not any(truncations.values())
    assert all(observation == "" for observation in observations.values())
    for agent in AGENTS:
        assert math.isclose(infos[agent]["metrics"]["return"], returns[agent], abs_tol=1e-9)
    with pytest.raises(RuntimeError, match="call reset"):  # tictactoe_v0's returned four empty dicts
        env.step(chosen)
    assert isinstance(env.unwrapped.transcript, str)


@given(actions=st.lists(hostile_text(), min_size=1, max_size=6), seed=st.integers(0, 2**16))
def test_arbitrary_text_in_the_native_aec_tictactoe(actions: list[str], seed: int) -> None:
    env = load("tictactoe_v0").env()
    env.reset(seed=seed)
    for turn, _agent in enumerate(env.agent_iter(max_iter=60)):
        observation, reward, terminated, truncated, _ = env.last()
        assert isinstance(observation, str) and math.isfinite(reward)
        env.step(None if terminated or truncated else actions[turn % len(actions)])
    assert not env.agents, "the game must end: a random legal move is played after too many illegal ones"


# -- bad input to the PettingZoo APIs: a clear error, and nothing played -------------------------------------
BAD_PARALLEL_ACTIONS = [
    (None, TypeError, "actions must be a dict of agent name to str, got NoneType"),
    (["<A>", "<A>"], TypeError, "actions must be a dict of agent name to str, got list"),
    ({"player_9": "x"}, ValueError, "no agent 'player_9'; the agents are player_0, player_1"),
    ({}, ValueError, "no action for active agent 'player_0'"),
    (dict.fromkeys(AGENTS), TypeError, "an action is one LLM turn as str, got NoneType"),
    (dict.fromkeys(AGENTS, 7), TypeError, "an action is one LLM turn as str, got int"),
]


@ALL_GAMES
@pytest.mark.parametrize(("actions", "error", "message"), BAD_PARALLEL_ACTIONS)
def test_bad_parallel_actions_get_a_clear_error_and_change_nothing(
    game: str, kwargs: dict, actions: object, error: type[Exception], message: str
) -> None:
    env = load(game).parallel_env(**kwargs)
    with pytest.raises(RuntimeError, match=f"^{game}: the game has ended \\(or never started\\); call reset"):
        env.step(dict.fromkeys(AGENTS, "x"))
    env.reset(seed=3)
    before = env.unwrapped.transcript
    with pytest.raises(error, match=f"^{game}: {re.escape(message)}$"):
        env.step(actions)
    assert env.unwrapped.transcript == before and env.agents == list(AGENTS)
    observations, *_ = env.step(dict.fromkeys(AGENTS, "no tags"))  # the game goes on
    assert set(observations) == set(AGENTS)


@ALL_GAMES
@pytest.mark.parametrize(("action", "kind"), [(None, "NoneType"), (3, "int"), (b"<A>", "bytes")])
def test_a_bad_aec_action_is_refused_at_its_own_step_and_the_game_goes_on(
    game: str, kwargs: dict, action: object, kind: str
) -> None:
    # The converted AEC games stored the action until the last agent of the cycle stepped, which then raised
    # (for the other agent), and so did every later step.
    env = load(game).env(**kwargs)
    env.reset(seed=3)
    first = env.agent_selection
    with pytest.raises(TypeError, match=f"^{game}: an action is one LLM turn as str, got {kind}$"):
        env.step(action)
    assert env.agent_selection == first
    for _agent in env.agent_iter(max_iter=1000):  # every later step works, to the end of the game
        _, _, terminated, truncated, _ = env.last()
        env.step(None if terminated or truncated else "no tags")
    assert not env.agents


@pytest.mark.parametrize("game", sorted(set(GAMES) - {"tictactoe_v0"}))
def test_an_inactive_agent_may_pass_none_in_aec(game: str) -> None:
    env = load(game).env()
    env.reset(seed=0)
    for _agent in env.agent_iter(max_iter=1000):
        _, _, terminated, truncated, info = env.last()
        env.step("no tags" if info.get("active") and not (terminated or truncated) else None)
    assert not env.agents


@ALL_GAMES
def test_a_finished_agent_steps_only_with_none(game: str, kwargs: dict) -> None:
    env = load(game).env(**kwargs)
    env.reset(seed=0)
    for _agent in env.agent_iter(max_iter=400):
        _, _, terminated, truncated, _ = env.last()
        if terminated or truncated:
            with pytest.raises(ValueError, match="only valid action is None"):  # was a bare AssertionError
                env.step("<A>")
            return
        env.step("no tags")
    pytest.fail("no agent finished")


# -- render modes ---------------------------------------------------------------------------------------------
@ALL_GAMES
@pytest.mark.parametrize("api", ["parallel_env", "env"])
def test_human_render_prints_as_the_game_goes_and_returns_none(
    game: str, kwargs: dict, api: str, capsys: pytest.CaptureFixture[str]
) -> None:
    env = getattr(load(game), api)(**kwargs, render_mode="human")
    env.reset(seed=0)
    assert "[rules]" in capsys.readouterr().out
    assert env.render() is None and capsys.readouterr().out == "", "already printed: not printed again"
    ansi = getattr(load(game), api)(**kwargs, render_mode="ansi")
    ansi.reset(seed=0)
    assert ansi.render().startswith("[rules]") and capsys.readouterr().out == ""
