"""Registration of every rl-llm environment under the ``rl-llm/`` namespace.

One line per environment: id, entry point and a one-line summary for ``rl-llm list``. Entry points are
strings, so registering imports nothing heavy.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym


@dataclass(frozen=True)
class EnvEntry:
    id: str
    entry_point: str
    summary: str
    kwargs: dict[str, Any] = field(default_factory=dict)


ENVIRONMENTS: tuple[EnvEntry, ...] = (
    EnvEntry(
        "rl-llm/MultiArmedBandit-v0",
        "rl_llm.envs.bandits.multi_armed_bandit:MultiArmedBanditEnv",
        "K-armed Bernoulli/Gaussian bandit; pick arms by label, regret metrics",
    ),
    EnvEntry(
        "rl-llm/ContextualBandit-v0",
        "rl_llm.envs.bandits.contextual_bandit:ContextualBanditEnv",
        "linear contextual bandit; context vector in text, per-step optimal arm",
    ),
    EnvEntry(
        "rl-llm/TicTacToe-v0",
        "rl_llm.envs.tictactoe.tic_tac_toe:TicTacToeEnv",
        "tic-tac-toe vs random / minimax / mixed opponent",
    ),
    EnvEntry(
        "rl-llm/TextToSQL-v0",
        "rl_llm.envs.sql.text_to_sql:TextToSQLEnv",
        "Text2SQL on real read-only SQLite DBs (Chinook, generated, Spider/BIRD dirs); execution-match reward",
    ),
    EnvEntry(
        "rl-llm/Search-v0",
        "rl_llm.envs.search.search:SearchEnv",
        "Search-R1 QA with BM25/dense/server retrieval; 1-3 hop generated KB or your corpus; EM/F1/format rewards",
    ),
    EnvEntry(
        "rl-llm/ToolCalls-v0",
        "rl_llm.envs.tools.tool_calls:ToolCallsEnv",
        "search + calculator + sandboxed python; XML or JSON tool calls; lookup-and-compute tasks",
    ),
    EnvEntry(
        "rl-llm/Terminal-v0",
        "rl_llm.envs.terminal.terminal_env:TerminalEnv",
        "sandboxed bash tasks (10 generated families, 3 levels, or your task dirs); completion-check reward",
    ),
    EnvEntry(
        "rl-llm/Math-v0",
        "rl_llm.envs.math.math_env:MathEnv",
        "reasoning-gym math problems (7 families, 3 levels, seeded); <answer> or \\boxed{} checked by math-verify",
    ),
)


def register_envs() -> None:
    """Register every environment with Gymnasium (idempotent).

    ``TextEnv`` already refuses a step before reset or after the end, and the test suite runs Gymnasium's
    full ``check_env`` on every environment, so ``gym.make`` skips the ``OrderEnforcing`` and
    ``PassiveEnvChecker`` wrappers: they would add two Python call layers to every step.
    """
    for entry in ENVIRONMENTS:
        if entry.id not in gym.registry:
            gym.register(
                id=entry.id,
                entry_point=entry.entry_point,
                kwargs=dict(entry.kwargs),
                order_enforce=False,
                disable_env_checker=True,
            )


GYM_MAKE_OPTIONS = ("max_episode_steps", "disable_env_checker")


@dataclass(frozen=True)
class EnvFactory:
    """``EnvFactory(env_id, **kwargs)()`` builds a fresh env; picklable and comparable by value.

    The one meaning of "env factory" in this package: anything that takes an env accepts an id, an
    ``EnvFactory`` or another zero-argument callable returning a ``gym.Env``; this one also crosses process
    boundaries (Ray workers, env servers) because it holds only the id and JSON-like keyword arguments."""

    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __init__(self, env_id: str, **kwargs: Any) -> None:
        if not isinstance(env_id, str) or not env_id:
            raise ValueError(f"env_id must be a non-empty string, got {env_id!r}")
        object.__setattr__(self, "env_id", env_id)
        object.__setattr__(self, "kwargs", dict(kwargs))

    def __call__(self) -> gym.Env:
        register_envs()  # a fresh worker process may not have imported rl_llm yet
        if self.env_id not in gym.registry:
            raise ValueError(f"unknown environment {self.env_id!r}; `rl-llm list` shows the registered ids")
        # gym.make consumes these two itself; every other name goes to the env's constructor.
        check_env_kwargs(self.env_id, {k: v for k, v in self.kwargs.items() if k not in GYM_MAKE_OPTIONS})
        return gym.make(self.env_id, **self.kwargs)

    def __hash__(self) -> int:
        # Equal factories must hash alike, and equality is the dataclass's (1 == 1.0 == True as values): so the
        # keyword names only, which equal factories always share (a JSON dump of the values hashed 1 and 1.0
        # apart, and a set or dict key could then hold two equal factories).
        return hash((self.env_id, tuple(sorted(self.kwargs))))


def arguments_error(name: str, kwargs: Mapping[str, Any], error: Exception) -> ValueError:
    """An env or game constructor's ``TypeError`` over an argument of the wrong type (``-k num_arms=abc``), as a
    ValueError naming the env and its arguments: the CLI's one-line error rather than a traceback."""
    arguments = ", ".join(f"{key}={value!r}" for key, value in kwargs.items())
    return ValueError(f"{name} cannot be built with {arguments or 'no arguments'}: {error}")


def env_ids() -> list[str]:
    return [entry.id for entry in ENVIRONMENTS]


def registered_id(env_id: str) -> str:
    """The id ``gym.make`` looks up: for Gymnasium's ``module:id`` form, the module is imported first (it
    registers the id), as ``gym.make`` itself does; an ImportError is the caller's to word."""
    import importlib

    module, colon, name = env_id.partition(":")
    if not colon:
        return env_id
    importlib.import_module(module)
    return name


def constructor_options(creator: Any) -> tuple[str, ...] | None:
    """The keyword options ``creator`` takes, or None when it takes ``**kwargs`` or its signature cannot be read.
    Cached per constructor: reading a signature costs more than building a cheap env (docs/serving.md#measurements)."""
    try:
        return _cached_options(creator)
    except TypeError:  # an unhashable callable: read it every time
        return _read_options(creator)


def _read_options(creator: Any) -> tuple[str, ...] | None:
    import inspect

    try:
        parameters = inspect.signature(creator).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    return tuple(name for name, p in parameters.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL)


_cached_options = functools.lru_cache(maxsize=256)(_read_options)


def env_creator(env_id: str) -> Any:
    """What builds ``env_id`` (a registered id, Gymnasium's ``module:id`` form, or ``social/<game>``): its class
    or factory, loaded, nothing built."""
    from gymnasium.envs.registration import load_env_creator

    if env_id.startswith("social/"):
        from rl_llm.envs.social import load

        return load(env_id.removeprefix("social/")).raw_env
    entry = gym.spec(registered_id(env_id)).entry_point
    return load_env_creator(entry) if isinstance(entry, str) else entry


def declared_reset_options(env_id: str) -> frozenset[str] | None:
    """The ``reset(options=...)`` keys ``env_id``'s class reads (``TextEnv.reset_options``); None when it does
    not say (every key passes) or the id is not registered."""
    try:
        creator = env_creator(env_id)
    except gym.error.Error:
        return None
    return getattr(creator, "reset_options", None)


def check_env_kwargs(env_id: str, kwargs: dict[str, Any], also_takes: tuple[str, ...] = ()) -> None:
    """Raise ``ValueError`` naming the env's options when ``kwargs`` holds a name its constructor does not take
    (read from the signature: nothing is built). ``env_id`` is a registered id, Gymnasium's ``module:id`` form,
    or ``social/<game>`` (the game's options); ``also_takes`` names options a wrapper around the env accepts
    (a served game seat's ``opponent``). A constructor that takes ``**kwargs``, or whose signature cannot be
    read, passes: the env itself says what is wrong there. Without this, a misspelt option is a TypeError deep
    in a rollout, or a server's traceback."""
    options = constructor_options(env_creator(env_id))
    if options is None:
        return
    names = [*also_takes, *options]
    unknown = [key for key in kwargs if key not in names]
    if unknown:
        raise ValueError(f"{env_id} takes no option {', '.join(map(repr, unknown))}; its options are "
                         f"{', '.join(names) or 'none'}")  # fmt: skip
