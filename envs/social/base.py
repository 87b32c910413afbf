"""``SocialEnv``: the shared skeleton of the two-player text games (PettingZoo parallel API).

A game is a sequence of *phases* (a move, a message, a proposal). In each phase some agents are *active*:
each must submit a valid action, parsed from its text. A valid action is locked in; an invalid one gets a
corrective observation and another try, and after ``max_retries`` invalid retries in a row the phase's
default action (defect, an empty message, a proposal to keep nothing) is played for that agent. When every
active agent has an action the phase resolves. Actions of inactive agents are ignored, and their info says
``active: False`` so a driver need not ask them.

Observations follow docs/design.md#the-environment-contract: each is the text of the agent's next user
message (the rules and the first prompt on reset; then what happened since, ending with what to do now on the
last line), and an empty string once the game is over. ``render()`` returns the whole transcript (``"human"``
mode prints each step as it happens instead, and ``render()`` returns None).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import numpy as np
from gymnasium.utils import seeding
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.conversions import parallel_to_aec_wrapper
from pettingzoo.utils.wrappers import OrderEnforcingWrapper

from rl_llm import checks
from rl_llm.envs.base import MAX_TEXT_LENGTH, print_text
from rl_llm.envs.parsing import truncate_middle
from rl_llm.envs.spaces import UnicodeText

AGENTS = ("player_0", "player_1")
WAITING = "Waiting for the other player. Your next reply is ignored."
# Actions are kept in the transcript up to this many characters (head and tail).
TRANSCRIPT_ACTION_CHARS = 2000


class ObservationText(str):
    """A ``str`` that declares its NumPy dtype.

    PettingZoo's ``api_test`` compares ``observation.dtype`` with the space's dtype; a plain ``str`` has no
    ``dtype`` attribute, so text observations are returned as this subclass (equal to the plain string).
    """

    __slots__ = ()
    dtype = np.dtype(str)


def other(agent: str) -> str:
    return AGENTS[1] if agent == AGENTS[0] else AGENTS[0]


def number(value: float) -> str:
    """A payoff or quantity as short text: ``3``, ``7.69``."""
    return f"{round(float(value), 2):g}"


def plural(count: float, word: str, many: str | None = None) -> str:
    """``plural(1, "point")`` -> ``"1 point"``; ``plural(2.5, "point")`` -> ``"2.5 points"``."""
    return f"{number(count)} {word if number(count) == '1' else (many or word + 's')}"


def points_text(value: float) -> str:
    return plural(value, "point")


class TwoPlayerTextGame:
    """What every two-player text game here shares, AEC or parallel: the agents, ``UnicodeText`` spaces (the
    same object per agent on every call, as PettingZoo requires), seeding, checks and the transcript."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "human"], "name": "text_game"}
    #: Stop strings a generator should use (the closing tags of actions).
    stop: ClassVar[tuple[str, ...]] = ()

    def _setup(self, *, max_retries: int, render_mode: str | None) -> None:
        max_retries = checks.integer("max_retries", max_retries)  # 2.5 was int()'d, NaN int()'s own error
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.max_retries = int(max_retries)
        self.render_mode = render_mode
        self.possible_agents = list(AGENTS)
        self.agents: list[str] = []
        self._observation_spaces = {agent: UnicodeText(MAX_TEXT_LENGTH) for agent in AGENTS}
        self._action_spaces = {agent: UnicodeText(MAX_TEXT_LENGTH) for agent in AGENTS}
        self._seed_rng: np.random.Generator | None = None
        self._transcript: list[str] = []
        self._printed = 0  # transcript entries already printed in "human" mode

    def observation_space(self, agent: str) -> UnicodeText:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> UnicodeText:
        return self._action_spaces[agent]

    def _seed_episode(self, seed: int | None) -> None:
        """Draw this game's seed (``episode_seed``, in the task id) and its generator ``rng``. A seeded
        reset restarts the sequence; unseeded resets continue it."""
        if seed is not None or self._seed_rng is None:
            self._seed_rng, _ = seeding.np_random(seed)
        self.episode_seed = int(self._seed_rng.integers(2**31))
        self.rng = np.random.default_rng(self.episode_seed)

    def _reset_counters(self) -> None:
        """Zero the per-agent return and the invalid-try bookkeeping for a new game."""
        self._returns = dict.fromkeys(AGENTS, 0.0)
        self._invalid = dict.fromkeys(AGENTS, 0)  # invalid tries in the game
        self._defaults = dict.fromkeys(AGENTS, 0)  # default actions played for the agent
        self._streak = dict.fromkeys(AGENTS, 0)  # invalid tries in a row (a valid action resets it)

    def _count_invalid(self, agent: str) -> int:
        """Count an invalid try of ``agent``; return how many more invalid tries it has before the default
        action is played for it, or 0 when that happens now (after ``max_retries`` invalid retries in a row:
        the default is counted and the streak restarts)."""
        self._invalid[agent] += 1
        self._streak[agent] += 1
        if self._streak[agent] > self.max_retries:
            self._defaults[agent] += 1
            self._streak[agent] = 0
            return 0
        return self.max_retries - self._streak[agent] + 1

    def _try_metrics(self, agent: str) -> dict[str, float]:
        """The invalid-try metrics of ``agent``: ``invalid_actions`` and ``default_actions``."""
        return {"invalid_actions": float(self._invalid[agent]), "default_actions": float(self._defaults[agent])}

    def _echo(self) -> None:
        """In ``"human"`` mode, print the transcript entries added since the last call."""
        if self.render_mode == "human":
            print_text("\n\n".join(self._transcript[self._printed :]))
        self._printed = len(self._transcript)

    def render(self) -> str | None:
        """The game's transcript (rules, every action, what each player was told); None in ``"human"`` mode,
        where every step was already printed as it happened (as ``TextEnv.render``: this printed the whole
        transcript again on each call)."""
        if self.render_mode == "human":
            return None
        return self.transcript

    def close(self) -> None:
        """Nothing to release."""

    @property
    def transcript(self) -> str:
        return "\n\n".join(self._transcript)


class SocialEnv(TwoPlayerTextGame, ParallelEnv[str, str, str]):
    """Base class: a two-player game played by text, round after round."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "human"], "name": "social", "is_parallelizable": True}

    def __init__(self, *, num_rounds: int, max_retries: int, render_mode: str | None = None) -> None:
        self.num_rounds = checks.integer("num_rounds", num_rounds, minimum=1)
        self._setup(max_retries=max_retries, render_mode=render_mode)

    # -- what a game implements ------------------------------------------------------------------------
    def _start(self, options: dict[str, Any]) -> str:
        """Set up a new game from ``self.rng``; return the rules (shown to both agents once)."""
        raise NotImplementedError

    def _phase(self) -> tuple[str, tuple[str, ...]]:
        """The current phase's name and its active agents."""
        raise NotImplementedError

    def _prompt(self, agent: str) -> str:
        """One line telling an active agent what to submit now."""
        raise NotImplementedError

    def _parse(self, agent: str, text: str) -> tuple[Any, str | None]:
        """``(action, None)`` for a valid turn, ``(None, reason)`` for an invalid one."""
        raise NotImplementedError

    def _default(self, agent: str) -> tuple[Any, str]:
        """The action played after too many invalid tries, and how to describe it."""
        raise NotImplementedError

    def _resolve(self, actions: dict[str, Any]) -> dict[str, float]:
        """Apply the locked actions of the phase, report with ``_tell``, advance; return per-agent rewards."""
        raise NotImplementedError

    def _game_metrics(self, agent: str) -> dict[str, float]:
        return {}

    @property
    def task_name(self) -> str:
        return str(self.metadata["name"])

    # -- PettingZoo API ---------------------------------------------------------------------------------
    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        """Start a game. Unknown ``options`` keys are ignored (PettingZoo's API test passes one)."""
        if options is not None and not isinstance(options, Mapping):  # checked before the game changes
            raise TypeError(f"{type(self).__name__}: reset options must be a dict, got {type(options).__name__}")
        self._seed_episode(seed)
        self.task_id = f"{self.task_name}-{self.episode_seed}"
        self.agents = list(AGENTS)
        self.round = 1
        self._reset_counters()
        self._locked: dict[str, Any] = {}
        self._news: dict[str, list[str]] = {agent: [] for agent in AGENTS}
        rules = self._start(dict(options or {}))
        self._transcript = [f"[rules]\n{rules}"]
        observations = {agent: self._observation(agent, rules) for agent in AGENTS}
        invalid = dict.fromkeys(AGENTS, False)
        infos = {agent: self._info(agent, invalid) for agent in AGENTS}
        for agent in AGENTS:
            infos[agent]["system_prompt"] = self._system_prompt(agent)
            infos[agent]["stop"] = list(self.stop)
        self._log_observations(observations)
        self._printed = 0
        self._echo()
        return observations, infos

    def step(self, actions: Mapping[str, str]) -> tuple[dict, dict, dict, dict, dict]:
        if not self.agents:
            raise RuntimeError(f"{self.metadata['name']}: the game has ended (or never started); call reset()")
        _, active = self._phase()
        waiting = [agent for agent in active if agent not in self._locked]
        # Every action is checked before any is played, so a rejected call changes nothing.
        check_parallel_actions(str(self.metadata["name"]), actions, waiting)
        invalid = dict.fromkeys(AGENTS, False)
        for agent in waiting:
            text = actions[agent]
            self._transcript.append(f"[{agent}]\n{truncate_middle(text, TRANSCRIPT_ACTION_CHARS)}")
            action, reason = self._parse(agent, text)
            if reason is None:
                self._streak[agent] = 0
                self._locked[agent] = action
            else:
                invalid[agent] = True
                self._reject(agent, reason)
        rewards = dict.fromkeys(AGENTS, 0.0)
        if all(agent in self._locked for agent in active):
            locked, self._locked = self._locked, {}
            rewards = {agent: float(reward) for agent, reward in self._resolve(locked).items()}
            for agent, reward in rewards.items():
                self._returns[agent] += reward
        done = self.round > self.num_rounds
        observations = {agent: self._observation(agent, final=done) for agent in AGENTS}
        infos = {agent: self._info(agent, invalid) for agent in AGENTS}
        terminations = dict.fromkeys(AGENTS, done)
        truncations = dict.fromkeys(AGENTS, False)
        self._log_observations(observations)
        if done:
            self._transcript.append(f"[result] returns: {self._returns}")
            self.agents = []
        self._echo()
        return observations, rewards, terminations, truncations, infos

    # -- helpers for games ------------------------------------------------------------------------------
    def _tell(self, agent: str, text: str) -> None:
        """Add a paragraph to ``agent``'s next observation."""
        self._news[agent].append(text)

    def _system_prompt(self, agent: str) -> str:
        return f"You are {agent}, one of two players in a repeated text game. Follow the rules you are given."

    def _reject(self, agent: str, reason: str) -> None:
        left = self._count_invalid(agent)
        default, description = self._default(agent)
        if not left:
            self._locked[agent] = default
            self._tell(agent, f"Invalid action: {reason} Too many invalid tries: {description} was played for you.")
        else:
            self._tell(agent, f"Invalid action: {reason} Try again ({plural(left, 'more invalid try', 'more invalid tries')} and "
                              f"{description} is played for you).")

    def _is_active(self, agent: str) -> bool:
        return agent in self._phase()[1] and agent not in self._locked

    def _observation(self, agent: str, first: str | None = None, *, final: bool = False) -> ObservationText:
        news = ([first] if first else []) + self._news[agent]
        self._news[agent] = []
        if final:  # the game is over: the observation is empty, the last news goes to the transcript
            if news:
                self._transcript.append(f"[end {agent}]\n" + "\n\n".join(news))
            return ObservationText("")
        news.append(self._prompt(agent) if self._is_active(agent) else WAITING)
        return ObservationText("\n\n".join(news))

    def _info(self, agent: str, invalid: dict[str, bool]) -> dict[str, Any]:
        over = self.round > self.num_rounds
        metrics = {
            "return": self._returns[agent],
            "rounds": float(min(self.round - 1, self.num_rounds)),
            **self._try_metrics(agent),
            **self._game_metrics(agent),
        }
        return {
            "task_id": self.task_id,
            "seed": self.episode_seed,
            "round": min(self.round, self.num_rounds),
            "phase": "over" if over else self._phase()[0],
            "active": not over and self._is_active(agent),
            "invalid_action": invalid[agent],
            "metrics": metrics,
        }

    def _log_observations(self, observations: dict[str, str]) -> None:
        for agent, observation in observations.items():
            if observation:
                self._transcript.append(f"[to {agent}]\n{observation}")


def check_parallel_actions(game: str, actions: Any, active: Iterable[str]) -> None:
    """Refuse a parallel step's ``actions`` unless it maps agent names to actions with a str for every agent
    in ``active``. None or a list used to fail deep inside ("not iterable", "not subscriptable"), and a
    misspelt name's action was dropped without a word (docs/writing-an-environment.md#two-player-games)."""
    if not isinstance(actions, Mapping):
        raise TypeError(f"{game}: actions must be a dict of agent name to str, got {type(actions).__name__}")
    unknown = [agent for agent in actions if agent not in AGENTS]
    if unknown:
        raise ValueError(f"{game}: no agent {', '.join(map(repr, unknown))}; the agents are {', '.join(AGENTS)}")
    for agent in active:
        if agent not in actions:
            raise ValueError(f"{game}: no action for active agent {agent!r}")
        check_action(game, actions[agent])


def check_action(game: str, action: Any) -> None:
    """Refuse an action that is not one LLM turn (a str), with the same message in every game and API."""
    if not isinstance(action, str):
        raise TypeError(f"{game}: an action is one LLM turn as str, got {type(action).__name__}")


class CheckedParallelToAEC(parallel_to_aec_wrapper):
    """PettingZoo's ``parallel_to_aec`` converter, checking each AEC action as it comes. The converter stores
    an action until the last agent of the cycle steps: a None or an int then failed at that other agent's
    step, and stayed stored, so every later step failed too; a non-None action for a finished agent raised a
    bare AssertionError."""

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        name = str(self.env.metadata["name"])
        if self.terminations[agent] or self.truncations[agent]:
            if action is not None:
                raise ValueError(f"{name}: {agent!r} has finished; the only valid action is None, got "
                                 f"{type(action).__name__}")  # fmt: skip
        elif self.infos[agent].get("active"):  # an inactive agent's action is ignored, as in the parallel step
            check_action(name, action)
        super().step(action)


def module_constructors(cls: type[SocialEnv]) -> tuple[Callable[..., SocialEnv], Callable[..., AECEnv]]:
    """PettingZoo's module convention for a parallel game: ``parallel_env(**kwargs)`` builds it and
    ``env(**kwargs)`` gives the AEC form through PettingZoo's ``parallel_to_aec`` converter."""

    def parallel_env(**kwargs: Any) -> SocialEnv:
        return cls(**kwargs)

    def env(**kwargs: Any) -> AECEnv:
        return OrderEnforcingWrapper(CheckedParallelToAEC(cls(**kwargs)))  # what parallel_to_aec builds

    parallel_env.__doc__ = f"{cls.metadata['name']} with PettingZoo's parallel API (see ``raw_env``)."
    env.__doc__ = f"{cls.metadata['name']} with PettingZoo's AEC API, converted from the parallel game."
    return parallel_env, env
