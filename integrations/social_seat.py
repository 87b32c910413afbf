"""One seat of a two-player social game as a single-agent text env, for adapters that serve one agent.

OpenEnv, SkyRL-gym and verifiers drive one agent per connection or rollout. ``SocialSeat`` gives that agent
one seat (``player_0`` by default) of a parallel game from ``rl_llm.envs.social``; the other seat is played
either by a rule-based baseline (``opponent="tit_for_tat"``, any name of ``SOCIAL_BASELINES[game]``) or by
the caller, who passes the other player's text with each step (``step(action, opponent_action=...)``).

Reward is the seat's per-round payoff; ``info`` is the game's info for the seat plus ``reward_components``.
While the seat is waiting (the other player alone is asked), a baseline opponent is stepped until the seat
is asked again, so every ``step`` answers a real prompt. Env ids for the adapters: ``social/<game>``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rl_llm import checks
from rl_llm.envs.base import MAX_TEXT_LENGTH
from rl_llm.envs.spaces import UnicodeText
from rl_llm.types import Message

SOCIAL_PREFIX = "social/"
SEATS = ("player_0", "player_1")


class SocialSeat(gym.Env[str, str]):
    """One seat of a parallel social game.

    ## Description
    ``game`` (a name of ``rl_llm.envs.social.GAMES``, not the turn-based tictactoe_v0) played from ``seat``.

    ## Observation
    The seat's observation text (rules and round results, then what is asked now); empty once the game ends.

    ## Action
    The seat's LLM turn (``<A>``, ``<message>...</message>``, ``<propose>...</propose>``); ``step`` also takes
    ``opponent_action``, the other seat's turn, required when no baseline ``opponent`` plays it.

    ## Rewards
    The seat's payoff of the rounds resolved by the step (``reward_components["game"]``).

    ## Episode End
    When the game ends (its ``num_rounds``); never truncated here.

    ## Arguments
    ``seat`` ("player_0"), ``opponent`` (a baseline name, or None for given moves), ``opponent_seed`` and the
    game's own kwargs.

    ## Version History
    - v0: initial release.
    """

    metadata = {"render_modes": []}  # noqa: RUF012 (Gymnasium's convention)

    def __init__(self, game: str, seat: str = "player_0", opponent: str | None = None,
                 opponent_seed: int | None = None, **game_kwargs: Any) -> None:  # fmt: skip
        from rl_llm.envs.registration import check_env_kwargs
        from rl_llm.envs.social import load

        module = load(game)
        if not hasattr(module, "parallel_env"):
            raise ValueError(f"social game {game!r} is turn-based (AEC); serve rl-llm/TicTacToe-v0 instead")
        check_env_kwargs(SOCIAL_PREFIX + game, game_kwargs, also_takes=("seat", "opponent", "opponent_seed"))
        if seat not in SEATS:
            raise ValueError(f"seat must be one of {SEATS}, got {seat!r}")
        if opponent_seed is not None:  # a float or NaN seeded the opponent without a word
            checks.integer("opponent_seed", opponent_seed)
        self.game_name, self.seat = game, seat
        self.other = SEATS[1 - SEATS.index(seat)]
        self.game = module.parallel_env(**game_kwargs)
        self.opponent = _baseline(game, opponent, opponent_seed) if opponent else None
        self.observation_space = UnicodeText(MAX_TEXT_LENGTH)
        self.action_space = UnicodeText(MAX_TEXT_LENGTH)
        self._conversations: dict[str, list[Message]] = {}
        self._active: dict[str, bool] = {}
        self._over = True

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        observations, infos = self.game.reset(seed=seed, options=options)
        self._conversations = {
            agent: [
                Message("system", infos[agent]["system_prompt"]),
                Message("user", str(observations[agent])),
            ]
            for agent in SEATS
        }
        self._active = {agent: bool(infos[agent].get("active")) for agent in SEATS}
        self._over = False
        return str(observations[self.seat]), dict(infos[self.seat])

    def step(
        self, action: str, opponent_action: str | None = None
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._over:
            raise RuntimeError("SocialSeat: the game has ended (or never started); call reset()")
        if not isinstance(action, str):
            raise TypeError(f"SocialSeat: an action is one LLM turn as str, got {type(action).__name__}")
        result = self._play(action, opponent_action)
        total = result[1]
        # Let a baseline move alone while the seat waits, so the next observation asks the seat something.
        while not self._over and not self._active[self.seat] and self._active[self.other] and self.opponent:
            result = self._play("", None)
            total += result[1]
        observation, _, terminated, truncated, info = result
        info["reward_components"] = {"game": total}
        return observation, total, terminated, truncated, info

    def _play(
        self, action: str, opponent_action: str | None
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        actions = {self.seat: action}
        if self._active[self.other]:
            if opponent_action is None and self.opponent is None:
                raise ValueError(
                    f"{self.other} is to move and no opponent baseline is set: pass opponent_action"
                )
            actions[self.other] = opponent_action if opponent_action is not None else self._baseline_move()
        observations, rewards, terminations, truncations, infos = self.game.step(actions)
        for agent in SEATS:
            if actions.get(agent) is not None and self._active[agent]:
                self._conversations[agent].append(Message("assistant", actions[agent]))
            if observations[agent]:
                self._conversations[agent].append(Message("user", str(observations[agent])))
            self._active[agent] = bool(infos[agent].get("active"))
        terminated, truncated = bool(terminations[self.seat]), bool(truncations[self.seat])
        self._over = terminated or truncated
        return (
            str(observations[self.seat]),
            float(rewards[self.seat]),
            terminated,
            truncated,
            dict(infos[self.seat]),
        )

    def _baseline_move(self) -> str:
        assert self.opponent is not None
        return self.opponent.respond(self._conversations[self.other])

    def close(self) -> None:
        self.game.close()


def _baseline(game: str, name: str, seed: int | None) -> Any:
    from rl_llm.agents.baselines.social import SOCIAL_BASELINES

    choices = SOCIAL_BASELINES.get(game, {})
    if name not in choices:
        raise ValueError(f"unknown opponent {name!r} for {game}; choose from {sorted(choices)}")
    return choices[name](seed=seed)


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    """``rl-llm/<Name>-v0`` through Gymnasium, ``social/<game>`` as a :class:`SocialSeat`."""
    if env_id.startswith(SOCIAL_PREFIX):
        return SocialSeat(env_id.removeprefix(SOCIAL_PREFIX), **kwargs)
    from rl_llm.integrations.generic import EnvFactory

    return EnvFactory(env_id, **kwargs)()
