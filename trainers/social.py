"""Two-player games in the trainer: opponents, the paper's credit assignment, game metrics and evaluation.

The GRPO-family loop (``trainers/grpo.py``) is the same for single-agent and two-player training; a game run
differs only where ``TrainingRun`` asks this module (docs/multi-agent.md):

- **Collect**: ``group_size`` matches per seed through the rollout engine (``collect_games``), each seat its
  own trajectory with per-round rewards. The opponent of a seed group is drawn from ``social.opponents`` by
  weight (``self_play``, a baseline of the game or ``league``, a past policy of the run: trainers/league.py),
  from a stream seeded by (run seed, env seed), so resumes repeat it. In self-play both seats are trained on;
  against a baseline or a league member only the learner's seat.
- **Credit** (docs/research-protocols.md#social-games): per-round returns
  ``G_t = sum_{k>=t} gamma^(k-t) r_k / reward_scale`` (all tokens of a round share its credit), a per-round
  leave-one-out baseline over the games of a seed group (``rloo_by_round``), optionally per seat
  (``role_baseline``, SPIRAL's role-conditioned baseline for zero-sum self-play), and Advantage Alignment
  ``A*_t = A1_t + beta * (sum_{k<t} gamma_aa^(t-k) A1_k) * A2_t`` with ``A2`` the opponent's advantages on
  the same match.
- **Metrics**: each seat's return, welfare, cooperation rate, tit-for-tat likeness; held-out evaluation
  against the game's baselines with exploitability (what ``social.exploiter`` gets against the policy).
"""

from __future__ import annotations

import functools
import math
import re
import zlib
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rl_llm.trainers.config import ConfigError, SocialConfig
from rl_llm.trainers.generation import play_whole
from rl_llm.trainers.turn_credit import turn_returns
from rl_llm.types import Trajectory

if TYPE_CHECKING:
    from rl_llm.trainers.config import TrainConfig
    from rl_llm.trainers.league import League

SELF_PLAY = "self_play"
LEAGUE = "league"  # a past policy of the run (trainers/league.py)


def member_label(step: int) -> str:
    """A league opponent's name in trajectories and metrics: ``league:step-4``."""
    return f"{LEAGUE}:step-{step}"


def league_step(name: str) -> int | None:
    """The member step of a league opponent's name (None for any other opponent)."""
    prefix = LEAGUE + ":step-"
    return int(name[len(prefix) :]) if name.startswith(prefix) else None
SEATS = ("player_0", "player_1")

# The paper's values per game (docs/research-protocols.md#social-games): discount, reward normalising
# constant, Advantage Alignment's beta and gamma; TicTacToe (zero-sum) uses a per-seat baseline.
_MATRIX = {"gamma": 0.9, "reward_scale": 5.0, "beta": 0.5, "gamma_aa": 0.9, "role_baseline": False}
GAME_PRESETS: dict[str, dict[str, Any]] = {
    "prisoners_dilemma_v0": _MATRIX,
    "stag_hunt_v0": _MATRIX,
    "chicken_v0": _MATRIX,
    "split_v0": {"gamma": 0.9, "reward_scale": 100.0, "beta": 1.0, "gamma_aa": 0.9, "role_baseline": False},
    "trust_and_split_v0": {"gamma": 0.96, "reward_scale": 100.0, "beta": 2.0, "gamma_aa": 0.96, "role_baseline": False},
    "trust_and_split_v0:classic": {"gamma": 0.9, "reward_scale": 100.0, "beta": 1.0, "gamma_aa": 0.9,
                                   "role_baseline": False},
    "tictactoe_v0": {"gamma": 1.0, "reward_scale": 1.0, "beta": 0.5, "gamma_aa": 0.9, "role_baseline": True},
}  # fmt: skip


# -- configuration checks -----------------------------------------------------------------------------------
def known_env_ids() -> list[str]:
    from rl_llm.envs.registration import env_ids
    from rl_llm.envs.social import GAMES

    return [*env_ids(), *(f"social/{game}" for game in GAMES)]


def _registered_id(env_id: str) -> str:
    """``registered_id`` (envs/registration.py), an unimportable ``module:`` part worded as a ConfigError."""
    from rl_llm.envs.registration import registered_id

    try:
        return registered_id(env_id)
    except ImportError as error:
        module = env_id.partition(":")[0]
        raise ConfigError(f"env.id: cannot import {module!r} (from {env_id!r}): {error}") from error


def _check_env_kwargs(config: TrainConfig) -> None:
    """Every ``env.kwargs`` name is one the env takes (envs/registration.py ``check_env_kwargs``): a misspelt
    option, or the default job's bandit options left behind when only ``env.id`` changed, is one line at load
    time instead of a TypeError from deep inside the first rollout."""
    from rl_llm.envs.registration import check_env_kwargs
    from rl_llm.trainers.default_job import DEFAULT_JOB

    try:
        check_env_kwargs(config.env.id, dict(config.env.kwargs))
    except ValueError as error:
        hint = ""
        if config.env.id != DEFAULT_JOB["env"]["id"] and set(config.env.kwargs) & set(DEFAULT_JOB["env"]["kwargs"]):
            hint = (" (the default job's bandit options stay when only env.id changes: start from a config file "
                    "in configs/ for this env, or clear them with env.kwargs={})")
        raise ConfigError(f"env.kwargs: {error}{hint}") from error


def _check_baseline_names(config: TrainConfig) -> None:
    """A single-agent env's baselines named in the config exist, as the games' are checked below: a misspelled
    eval baseline was skipped without a word (its row missing from the table), a misspelled warm-start one
    refused only after the model had loaded. An env with no baselines defined (one of your own) skips them."""
    from rl_llm.agents.baselines import baselines_for

    available = baselines_for(_registered_id(config.env.id))
    if not available:
        return
    for name in config.eval.baselines:
        if name not in available:
            raise ConfigError(f"eval.baselines: {name!r} is not a baseline of {config.env.id}; choose from {available}")
    if config.sft.episodes and config.sft.data is None and config.sft.baseline not in available:
        raise ConfigError(f"sft.baseline: {config.sft.baseline!r} is not a baseline of {config.env.id}; choose from "
                          f"{available}")  # fmt: skip


def check_env_config(config: TrainConfig) -> None:
    """``env.id`` is known, and every option fits the kind of env (single-agent or two-player game)."""
    import gymnasium as gym

    from rl_llm.envs.social import GAMES

    env_id, game = config.env.id, config.game
    if (game is not None and game not in GAMES) or (game is None and _registered_id(env_id) not in gym.registry):
        raise ConfigError(f"env.id: unknown env {env_id!r}; known ids: {', '.join(known_env_ids())}")
    _check_env_kwargs(config)
    changed = _changed(config.social, SocialConfig(), "social.")
    if game is None:
        if changed:
            raise ConfigError(f"{changed[0]}: social.* options are for two-player games (env.id social/<game>), "
                              f"not {env_id}")
        _check_baseline_names(config)
        return
    for section in ("curriculum", "advantage", "rollout.filter"):  # single-agent options (docs/training.md)
        value = config
        for part in section.split("."):
            value = getattr(value, part, None)
        if value is not None and (keys := _changed(value, type(value)(), section + ".")):
            raise ConfigError(f"{keys[0]}: not available for two-player games ({env_id}): a single-agent option "
                              "(games have their own per-round credit, social.credit)")
    refused = {
        "algorithm": (config.algorithm not in ("grpo", "drgrpo", "rloo", "reinforce"),
                      "games train with the GRPO-family loop (rloo, reinforce, grpo, drgrpo)"),
        "otc.enabled": (config.otc.enabled, "OTC is a single-agent tool-call reward"),
        "rollout.pods_keep": (config.rollout.pods_keep is not None, "PODS down-sampling would break the match pairs"),
        # docs/multi-agent.md#backends-and-asynchronous-training: a match is trained on whole (both seats).
        "rollout.partial_rollouts": (config.rollout.partial_rollouts,
                                     "a match paused mid-game would split the pair of seats its advantages need"),
        "social.opponents": (LEAGUE in config.social.opponents and config.rollout.max_staleness is not None,
                             "league with asynchronous training (rollout.max_staleness): members are the trainer's "
                             "weights at step boundaries, which a generator running ahead does not have"),
        "social.per_seat_policies": (config.social.per_seat_policies, "separate policies per seat are not implemented yet"),
    }  # fmt: skip
    for key, (bad, why) in refused.items():
        if bad:
            raise ConfigError(f"{key}: not available for two-player games ({env_id}): {why}")
    social = config.social
    if social.credit not in ("round", "outcome"):
        raise ConfigError(f"social.credit: {social.credit!r} is not one of ['round', 'outcome']")
    if social.credit == "round" and config.algorithm not in ("rloo", "reinforce"):
        raise ConfigError(f"algorithm: {config.algorithm!r} with social.credit=round; the per-round credit is "
                          "algorithm rloo (leave-one-out baseline) or reinforce (none); use social.credit=outcome "
                          "for grpo/drgrpo")
    if social.advantage_alignment and social.credit != "round":
        raise ConfigError("social.advantage_alignment needs social.credit=round (per-round advantages)")
    if social.center_advantages and social.credit != "round":
        raise ConfigError("social.center_advantages needs social.credit=round (it centres per-round advantages)")
    if social.learner_seat not in ("alternate", *SEATS):
        raise ConfigError(f"social.learner_seat: {social.learner_seat!r} is not one of ['alternate', *{list(SEATS)}]")
    from rl_llm.agents.baselines.social import SOCIAL_BASELINES

    baselines = sorted(SOCIAL_BASELINES.get(game, {}))
    if not social.opponents:
        raise ConfigError("social.opponents: name at least one opponent (self_play, league or a baseline)")
    for name, weight in social.opponents.items():
        if name not in (SELF_PLAY, LEAGUE) and name not in baselines:
            raise ConfigError(f"social.opponents: unknown opponent {name!r} for {game}; choose from "
                              f"{[SELF_PLAY, LEAGUE, *baselines]}")
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not 0 < weight < math.inf:  # NaN too
            raise ConfigError(f"social.opponents.{name}: the weight must be a positive number, got {weight!r}")
    _check_league(social)
    for name in config.eval.baselines:
        if name not in baselines:
            raise ConfigError(f"eval.baselines: {name!r} is not a baseline of {game}; choose from {baselines}")
    if social.exploiter is not None and social.exploiter not in baselines:
        raise ConfigError(f"social.exploiter: {social.exploiter!r} is not a baseline of {game}; choose from {baselines}")
    if config.sft.episodes and config.sft.baseline not in baselines:
        raise ConfigError(f"sft.baseline: {config.sft.baseline!r} is not a baseline of {game}; choose from {baselines}")
    for key in ("gamma", "gamma_aa"):
        value = getattr(social, key)
        if value is not None and not 0 <= value <= 1:
            raise ConfigError(f"social.{key} must be in [0, 1], got {value}")
    if social.invalid_penalty < 0 or (social.invalid_penalty and social.credit != "round"):
        raise ConfigError("social.invalid_penalty must be >= 0, and works with social.credit=round")
    if social.invalid_credit not in ("round", "penalty"):
        raise ConfigError(f"social.invalid_credit: {social.invalid_credit!r} is not one of ['round', 'penalty']")
    if social.invalid_credit == "penalty" and social.credit != "round":
        raise ConfigError("social.invalid_credit=penalty works with social.credit=round")
    if social.reward_scale is not None and social.reward_scale <= 0:
        raise ConfigError(f"social.reward_scale must be positive, got {social.reward_scale}")


def _check_league(social: SocialConfig) -> None:
    """The league (docs/multi-agent.md#the-league): kept exactly when the opponent ``league`` is played."""
    size, every = social.league_size, social.league_every
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ConfigError(f"social.league_size must be an integer >= 0 (0: no league), got {size!r}")
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ConfigError(f"social.league_every must be an integer >= 1 (steps between members), got {every!r}")
    if LEAGUE in social.opponents and size == 0:
        raise ConfigError("social.opponents: league is named but social.league_size is 0; set the number of past "
                          "policies to keep (the paper: 30)")
    if size and LEAGUE not in social.opponents:
        raise ConfigError(f"social.league_size: {size} past policies would be kept but never played; name league "
                          "in social.opponents (e.g. {self_play: 1, league: 1})")


def _changed(value: Any, default: Any, prefix: str) -> list[str]:
    from dataclasses import fields

    return [prefix + f.name for f in fields(value) if getattr(value, f.name) != getattr(default, f.name)]


def exploiter(config: TrainConfig) -> str:
    """``social.exploiter``, or the game's greedy baseline."""
    if config.social.exploiter is not None:
        return config.social.exploiter
    from rl_llm.agents.baselines.social import SOCIAL_BASELINES

    names = list(SOCIAL_BASELINES.get(config.game or "", {}))
    return next((name for name in ("always_defect", "greedy", "minimax") if name in names), names[0] if names else "")


def resolved(config: TrainConfig) -> dict[str, Any]:
    """The credit settings of a game run: the config's values, the game's preset where the config says None."""
    game = config.game or ""
    key = f"{game}:classic" if game == "trust_and_split_v0" and config.env.kwargs.get("variant") == "classic" else game
    preset = GAME_PRESETS.get(key, _MATRIX)
    social = config.social
    return {name: preset[name] if getattr(social, name) is None else getattr(social, name)
            for name in ("gamma", "reward_scale", "beta", "gamma_aa", "role_baseline")}  # fmt: skip


# -- credit assignment ----------------------------------------------------------------------------------------
def round_rewards(trajectory: Trajectory) -> dict[int, float]:
    """Reward per game round (``turn.info["round"]``, else the turn's index + 1), rounds in order of play."""
    rewards: dict[int, float] = {}
    for index, turn in enumerate(trajectory.turns):
        key = int(turn.info.get("round", index + 1))
        rewards[key] = rewards.get(key, 0.0) + float(turn.reward)
    return rewards


def discounted_returns(rewards: Sequence[float], gamma: float, scale: float = 1.0) -> list[float]:
    """``G_t = sum_{k>=t} gamma^(k-t) r_k / scale`` for each round ``t`` (the turn-level return-to-go of
    trainers/turn_credit.py over the scaled round rewards)."""
    return turn_returns([reward / scale for reward in rewards], gamma)


def round_returns(trajectory: Trajectory, gamma: float, scale: float = 1.0) -> dict[int, float]:
    rewards = round_rewards(trajectory)
    return dict(zip(rewards, discounted_returns(list(rewards.values()), gamma, scale), strict=True))


def rloo_by_round(returns: Sequence[dict[int, float]], groups: Sequence[Hashable],
                  games: Sequence[Hashable] | None = None) -> list[dict[int, float]]:  # fmt: skip
    """Per round ``t``: ``A_i,t = G_i,t - mean_{j} G_j,t`` over the members ``j`` of ``i``'s group that played
    round ``t`` in other games than ``i``'s (``games``: each member's game; default, each its own); a member
    with no such other member keeps ``G_i,t`` (baseline 0, as ``advantages.rloo``). Other games only: in
    self-play both seats of a game are in one group, and the co-player's return depends on ``i``'s own
    moves (defecting lowers it), so counting it made the baseline depend on the action it judges."""
    members: dict[Hashable, list[int]] = {}
    for i, group in enumerate(groups):
        members.setdefault(group, []).append(i)
    game_of = list(games) if games is not None else list(range(len(returns)))
    out: list[dict[int, float]] = []
    for i, own in enumerate(returns):
        advantages = {}
        for t, value in own.items():
            others = [returns[j][t] for j in members[groups[i]] if game_of[j] != game_of[i] and t in returns[j]]
            advantages[t] = value - (sum(others) / len(others) if others else 0.0)
        out.append(advantages)
    return out


def advantage_alignment(own: Sequence[float], opponent: Sequence[float], beta: float, gamma: float) -> list[float]:
    """``A*_t = A1_t + beta * (sum_{k<t} gamma^(t-k) A1_k) * A2_t`` (the paper's variant: k = t excluded)."""
    out, past = [], 0.0  # past = sum_{k<t} gamma^(t-k) A1_k
    for t, (a1, a2) in enumerate(zip(own, opponent, strict=True)):
        past = gamma * past + (gamma * own[t - 1] if t else 0.0)
        out.append(a1 + beta * past * a2)
    return out


def token_advantages(trajectories: Sequence[Trajectory], per_round: Sequence[dict[int, float]],
                     policy_mask: torch.Tensor, invalid_penalty: float = 0.0,
                     invalid_shares_round: bool = True) -> torch.Tensor:
    """Each turn's policy tokens get the advantage of the turn's round, less ``invalid_penalty`` on an invalid
    turn (``-invalid_penalty`` alone when not ``invalid_shares_round``): ``[N, T]`` like ``policy_mask``."""
    out = torch.zeros(policy_mask.shape, dtype=torch.float32)
    for row, (trajectory, advantages) in enumerate(zip(trajectories, per_round, strict=True)):
        for index, turn in enumerate(trajectory.turns):
            key = int(turn.info.get("round", index + 1))
            value = 0.0 if turn.invalid_action and not invalid_shares_round else float(advantages.get(key, 0.0))
            value -= invalid_penalty if turn.invalid_action else 0.0
            out[row, turn.token_start : turn.token_end] = value
    return out.to(policy_mask.device) * policy_mask.to(torch.float32)


@dataclass
class Match:
    """One game: its seats' trajectories (``SEATS`` order) and which seats the learner played."""

    seats: tuple[Trajectory, ...]
    learner: tuple[int, ...]
    opponent: str  # self_play or the baseline's name


def learner_trajectories(matches: Sequence[Match]) -> list[Trajectory]:
    """The trajectories a game step trains on: the learner's seats of each match (both in self-play)."""
    return [match.seats[s] for match in matches for s in match.learner]


def match_seats(matches: Sequence[Match]) -> list[Trajectory]:
    """Every seat of ``matches``, both players': what a lost generation server may have cut short."""
    return [seat for match in matches for seat in match.seats]


def match_advantages(matches: Sequence[Match], config: TrainConfig) -> dict[int, dict[int, float]]:
    """Per-round advantages of every learner trajectory (keyed by ``id(trajectory)``): RLOO per round over its
    seed group (per seat with ``role_baseline``), plus the Advantage Alignment term when it is on."""
    settings = resolved(config)
    baseline = config.algorithm == "rloo"
    flat: list[Trajectory] = []
    groups: list[Hashable] = []
    games: list[int] = []
    where: dict[int, tuple[int, int]] = {}
    for m, match in enumerate(matches):
        for s, trajectory in enumerate(match.seats):
            if trajectory.error is not None:
                continue
            learner = s in match.learner
            seat = trajectory.seat if settings["role_baseline"] or not learner or match.opponent != SELF_PLAY else ""
            where[id(trajectory)] = (m, s)
            flat.append(trajectory)
            groups.append((trajectory.seed, match.opponent, learner, seat))
            games.append(m)
    returns = [round_returns(t, settings["gamma"], settings["reward_scale"]) for t in flat]
    advantages = rloo_by_round(returns, groups, games) if baseline else returns
    by_id = {id(t): a for t, a in zip(flat, advantages, strict=True)}
    out: dict[int, dict[int, float]] = {}
    for match in matches:
        for s in match.learner:
            own = by_id.get(id(match.seats[s]))
            if own is None:
                continue
            if config.social.advantage_alignment and len(match.seats) == 2:
                other = by_id.get(id(match.seats[1 - s]), {})
                keys = list(own)
                aligned = advantage_alignment([own[k] for k in keys], [other.get(k, 0.0) for k in keys],
                                              settings["beta"], settings["gamma_aa"])  # fmt: skip
                own = dict(zip(keys, aligned, strict=True))
            out[id(match.seats[s])] = own
    if config.social.center_advantages:
        values = [value for advantages in out.values() for value in advantages.values()]
        mean = sum(values) / len(values) if values else 0.0
        out = {key: {t: value - mean for t, value in advantages.items()} for key, advantages in out.items()}
    return out


def game_advantages(trajectories: Sequence[Trajectory], matches: Sequence[Match], config: TrainConfig,
                    policy_mask: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Token advantages ``[N, T]`` of the batch rows ``trajectories`` (learner seats of ``matches``)."""
    if config.social.credit == "round":
        per_trajectory = match_advantages(matches, config)
        return token_advantages(trajectories, [per_trajectory.get(id(t), {}) for t in trajectories], policy_mask,
                                config.social.invalid_penalty, config.social.invalid_credit == "round")  # fmt: skip
    from rl_llm.trainers.advantages import broadcast, outcome_advantages

    role = resolved(config)["role_baseline"]
    keys: dict[tuple, int] = {}
    ids = [keys.setdefault((t.group_id, t.opponent, t.seat if role else ""), len(keys)) for t in trajectories]
    group_ids = torch.tensor(ids, dtype=torch.long, device=scores.device)
    return broadcast(outcome_advantages(config.algorithm, scores, group_ids), policy_mask)


# -- opponents ------------------------------------------------------------------------------------------------
class Opponents:
    """Draws the opponent of each seed group by weight and says who plays each seat (``league``: a member of
    ``league``, drawn uniformly from the same stream, trainers/league.py)."""

    def __init__(self, config: TrainConfig, league: League | None = None) -> None:
        from rl_llm.agents.baselines.social import SOCIAL_BASELINES

        self.config = config
        self.league = league
        self.names = list(config.social.opponents)
        weights = np.array([float(config.social.opponents[n]) for n in self.names], dtype=np.float64)
        self.weights = weights / weights.sum()
        game = config.game or ""
        self.baselines = {name: SOCIAL_BASELINES[game][name](seed=config.seed) for name in self.names
                          if name not in (SELF_PLAY, LEAGUE)}  # fmt: skip

    def opponent(self, seed: int) -> str:
        """The opponent of seed group ``seed``: the same for the same run seed and env seed, on any resume (the
        league's member too, given the same members: they are part of each checkpoint)."""
        rng = np.random.default_rng([self.config.seed & 0xFFFFFFFF, seed & 0xFFFFFFFF, zlib.crc32(b"opponent")])
        name = self.names[int(rng.choice(len(self.names), p=self.weights))]
        if name == LEAGUE:
            if self.league is None:
                raise RuntimeError("the opponent league was drawn but this run keeps no league")
            return member_label(self.league.draw(rng))
        return name

    def learner_seat(self, seed: int) -> int:
        seat = self.config.social.learner_seat
        return seed % 2 if seat == "alternate" else SEATS.index(seat)

    def plan(self, seed: int) -> tuple[str, tuple[Any, Any], tuple[int, ...]]:
        """(opponent name, the players of both seats (None: the policy), the learner's seats)."""
        name = self.opponent(seed)
        if name == SELF_PLAY:
            return name, (None, None), (0, 1)
        seat = self.learner_seat(seed)
        other = LEAGUE if league_step(name) is not None else self.baselines[name]  # play_games seats the member
        players = [other, other]
        players[seat] = None
        return name, (players[0], players[1]), (seat,)


def play_games(config: TrainConfig, policy: Any, seeds: Sequence[int], group_size: int,
               plan: Callable[[int], tuple[str, tuple[Any, Any], tuple[int, ...]]],
               max_new_tokens: int, concurrency: int, league_player: Callable[[int], Any] | None = None,
               **engine_options: Any) -> list[Match]:
    """``group_size`` matches per seed through the rollout engine, as ``plan(seed)`` says who plays.

    A league seat (``LEAGUE`` in the plan) is played by ``league_player(member step)``, one frozen copy that
    holds one member at a time: the seed groups of each member are played in a rollout of their own (the
    first member's with every other group), members in step order. A request's draw does not depend on its
    batch (agents/hf.py), so splitting the rollout changes no game."""
    from rl_llm.agents.rollout import collect_games

    plans = {seed: plan(seed) for seed in seeds}
    members = sorted({step for seed in seeds if (step := league_step(plans[seed][0])) is not None})
    if members and league_player is None:
        raise ValueError("a league opponent was drawn but play_games got no league_player")
    rollouts = [(members[0] if members else None, [s for s in seeds if league_step(plans[s][0]) in (None, *members[:1])])]
    rollouts += [(step, [s for s in seeds if league_step(plans[s][0]) == step]) for step in members[1:]]
    played: dict[int, list[tuple]] = {}
    for step, group in rollouts:
        member = league_player(step) if step is not None else None

        def players(seed: int, _: int, member: Any = member) -> tuple[Any, ...]:
            return tuple(member if isinstance(player, str) and player == LEAGUE else player for player in plans[seed][1])

        results = collect_games(config.env.id, policy, group, group_size, players=players, env_kwargs=config.env.kwargs,
                                max_new_tokens=max_new_tokens, concurrency=concurrency,
                                action_template=config.env.action_template, **engine_options)  # fmt: skip
        for index, seed in enumerate(group):
            played[seed] = results[index * group_size : (index + 1) * group_size]
    return [Match(seats=tuple(result), learner=plans[seed][2], opponent=plans[seed][0])
            for seed in seeds for result in played[seed]]  # fmt: skip


# -- metrics --------------------------------------------------------------------------------------------------
_RESULT = re.compile(r"you played (\w+), the other player played (\w+)\.")


def moves(trajectory: Trajectory) -> list[tuple[str, str]]:
    """(own move, other's move) per resolved round of a matrix game, read from the round results."""
    return [pair for turn in trajectory.turns for pair in _RESULT.findall(turn.observation)]


def tit_for_tat_likeness(trajectory: Trajectory) -> float:
    """How often a move repeats the opponent's move of the round before (NaN with fewer than two rounds)."""
    history = moves(trajectory)
    pairs = [history[t][0] == history[t - 1][1] for t in range(1, len(history))]
    return float(np.mean(pairs)) if pairs else math.nan


def step_metrics(matches: Sequence[Match]) -> dict[str, float]:
    """Per step: each seat's mean return, the welfare (sum of both seats), the learner's cooperation rate
    and tit-for-tat likeness, and the share of self-play matches."""
    out: dict[str, float] = {}
    for s, seat in enumerate(SEATS):
        out[f"game/return_{seat}"] = _nanmean([m.seats[s].total_reward for m in matches])
        out[f"game/learner_return_{seat}"] = _nanmean([m.seats[s].total_reward for m in matches if s in m.learner])
    out["game/welfare"] = _nanmean([sum(t.total_reward for t in m.seats) for m in matches])
    learners = [m.seats[s] for m in matches for s in m.learner]
    out["game/learner_return"] = _nanmean([t.total_reward for t in learners])
    out["game/cooperation_rate"] = _nanmean([t.metrics.get("cooperation_rate", math.nan) for t in learners])
    out["game/tit_for_tat_likeness"] = _nanmean([tit_for_tat_likeness(t) for t in learners])
    out["game/self_play_frac"] = _nanmean([float(m.opponent == SELF_PLAY) for m in matches])
    out["game/league_frac"] = _nanmean([float(league_step(m.opponent) is not None) for m in matches])
    return out


def _nanmean(values: Sequence[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return float(np.mean(values)) if values else math.nan


# -- evaluation -----------------------------------------------------------------------------------------------
def evaluate_game(config: TrainConfig, policy: Any, max_new_tokens: int, concurrency: int,
                  recover: Callable[[list[Any]], bool] | None = None) -> Any:  # fmt: skip
    """The policy against each of ``eval.baselines`` (and ``social.exploiter``) and itself on the held-out
    seeds, seats alternating by seed. Values per episode, named ``<figure>/<opponent>``: ``return`` (the
    policy's), ``opponent_return``, ``welfare``, ``cooperation_rate``, ``tit_for_tat_likeness``; ``return``
    alone is the mean over the baselines, and ``exploitability`` is the exploiter's return against it.
    ``recover``: as ``evaluate_llm``'s (an opponent's matches are played again after a generator restart)."""
    from dataclasses import replace

    from rl_llm.trainers.evaluation import EvalResult

    training_sampling = getattr(policy, "sampling", None)
    if training_sampling is not None:
        policy.sampling = replace(training_sampling, temperature=config.eval.temperature)
    try:
        return _evaluate_game(config, policy, max_new_tokens, concurrency, EvalResult, recover)
    finally:
        if training_sampling is not None:
            policy.sampling = training_sampling


def _evaluate_game(config: TrainConfig, policy: Any, max_new_tokens: int, concurrency: int, result: Any,
                   recover: Callable[[list[Any]], bool] | None = None) -> Any:  # fmt: skip
    seeds = list(range(config.eval.seed, config.eval.seed + config.eval.episodes))
    names = list(dict.fromkeys([*config.eval.baselines, exploiter(config)]))
    evaluation_config = _with_opponents(config, names)
    opponents = Opponents(evaluation_config)
    values: dict[str, list[float]] = {}
    for name in [*names, SELF_PLAY]:
        def plan(seed: int, name: str = name) -> tuple[str, tuple[Any, Any], tuple[int, ...]]:
            if name == SELF_PLAY:
                return name, (None, None), (0,)
            seat = seed % 2
            players = [opponents.baselines[name], opponents.baselines[name]]
            players[seat] = None
            return name, (players[0], players[1]), (seat,)

        play = functools.partial(play_games, config, policy, seeds, 1, plan, max_new_tokens, concurrency)
        matches = play_whole(play, recover, episodes=match_seats)
        for match in matches:
            s = match.learner[0]
            own, other = match.seats[s], match.seats[1 - s]
            row = {"return": own.total_reward, "opponent_return": other.total_reward,
                   "welfare": own.total_reward + other.total_reward,
                   "cooperation_rate": own.metrics.get("cooperation_rate", math.nan),
                   "tit_for_tat_likeness": tit_for_tat_likeness(own),
                   "invalid_actions": own.metrics.get("invalid_actions", math.nan)}  # fmt: skip
            for key, value in row.items():
                values.setdefault(f"{key}/{name}", []).append(float(value))
    baseline_returns = np.array([values[f"return/{name}"] for name in config.eval.baselines] or [[math.nan] * len(seeds)])
    values["return"] = ([float(v) for v in np.nanmean(baseline_returns, axis=0)] if config.eval.baselines
                        else list(values[f"return/{SELF_PLAY}"]))  # fmt: skip
    values["exploitability"] = list(values[f"opponent_return/{exploiter(config)}"])
    return result(seeds=seeds, values=values)


def _with_opponents(config: TrainConfig, names: Sequence[str]) -> TrainConfig:
    import copy

    clone = copy.deepcopy(config)
    clone.social.opponents = {name: 1.0 for name in names}
    return clone


def comparison_columns(config: TrainConfig, rows: dict[str, Any]) -> list[str]:
    """The before/after table's columns for a game: return, exploitability, per-opponent returns, self-play."""
    wanted = ["return", "exploitability", *(f"return/{name}" for name in config.eval.baselines),
              f"cooperation_rate/{SELF_PLAY}", f"welfare/{SELF_PLAY}", f"tit_for_tat_likeness/{SELF_PLAY}"]
    def shown(column: str) -> bool:  # present in every row, and a number somewhere (no cooperation in TicTacToe)
        present = all(column in row.values for row in rows.values())
        return present and any(not math.isnan(v) for row in rows.values() for v in row.values[column])

    return [column for column in dict.fromkeys(wanted) if shown(column)]


def sample_matches(matches: Sequence[Match], count: int) -> list[Trajectory]:
    """Both seats of ``count`` matches for samples.jsonl: the learner's best and worst first."""
    if count <= 0 or not matches:
        return []
    def score(match: Match) -> float:
        return sum(match.seats[s].total_reward for s in match.learner)

    ranked = sorted(range(len(matches)), key=lambda m: score(matches[m]))
    picked = list(dict.fromkeys([ranked[-1], ranked[0], *range(len(matches))]))[:count]
    return [trajectory for m in picked for trajectory in matches[m].seats]
