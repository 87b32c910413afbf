"""Serve any rl-llm environment as an OpenEnv environment, with openenv-core's own server (``create_app``).

OpenEnv (``pip install openenv-core``, or ``pip install 'rl-llm[openenv]'``) is the environment protocol TRL,
torchforge, SkyRL, Unsloth, verifiers and others consume: ``POST /reset``, ``POST /step``, ``GET /state``,
``GET /schema`` and the session WebSocket ``/ws``. Run::

    python -m rl_llm.integrations.openenv --env rl-llm/TicTacToe-v0 -k opponent=minimax --port 8000
    python -m rl_llm.integrations.openenv --env social/prisoners_dilemma_v0 -k opponent=tit_for_tat

and drive it with openenv-core's ``GenericEnvClient`` (or any typed ``EnvClient``)::

    from openenv.core import GenericEnvClient
    with GenericEnvClient(base_url="http://localhost:8000").sync() as env:
        result = env.reset(seed=3)                       # result.observation["text"], ["system_prompt"]
        result = env.step({"message": "<move>B2</move>"})
        result.reward, result.done, result.observation["info"]["reward_components"]

The action is ``{"message": str}``: the text of one LLM turn, as in OpenEnv's TextArena env (a social game
served without a baseline opponent also takes ``opponent_message``, the other seat's turn). The observation
holds ``text`` (the env's reply), ``system_prompt``, ``task_id``, ``stop`` and ``info`` (rl-llm's step info:
``reward_components``, ``metrics``, ``invalid_action``, ``terminated``, ``truncated``...); ``reward`` and
``done`` are OpenEnv's own fields. ``reset`` takes ``seed``, ``episode_id`` and ``options`` (the env's reset
options, e.g. ``{"task_index": 3}``).

Sessions: each WebSocket connection owns one env, isolated from the others (``--max-sessions`` bounds them).
OpenEnv's plain-HTTP ``/reset`` and ``/step`` build a fresh env per request; to play a whole episode over
plain HTTP, pass an ``episode_id`` to ``/reset`` and the same ``episode_id`` to every ``/step`` (OpenEnv's
step request accepts extra fields): the episode is kept server-side until it ends, or for ``episode_ttl_s``.

Well-formed plain-HTTP resets and steps are answered ahead of openenv-core's routes, with its own request and
reply models and the same env calls (``plain_http_routes``, docs/serving.md#fast-routes), and so are a ``/ws``
session's resets and steps once openenv-core's handler has called its env (``OpenEnvSocket``,
docs/serving.md#openenv-websocket-sessions); everything else, every validation error included, is
openenv-core's.

Bad input is a 4xx and leaves the session usable: a malformed action 422 (OpenEnv's validation), bad reset
options 400, an unknown ``episode_id`` 404, stepping an ended episode or a busy one 409. Over the WebSocket
the same errors come back as OpenEnv error messages and the connection stays open.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
from fastapi import HTTPException
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field
from pydantic_core import to_json

from rl_llm import checks
from rl_llm.console import ArgumentParser, count_flag, seconds_flag
from rl_llm.envs.base import MAX_TEXT_LENGTH
from rl_llm.integrations.fast_routes import (
    MAX_BODY_BYTES,
    BodyLimit,
    FastRoute,
    FastRoutes,
    answer_validation_errors_safely,
)
from rl_llm.integrations.generic import jsonable, parse_kwarg_pairs, step_info
from rl_llm.integrations.inline_calls import InlinePolicy, timed
from rl_llm.integrations.openenv_ws import OpenEnvSocket, claim_for_connection
from rl_llm.integrations.social_seat import SocialSeat, make_env


# -- OpenEnv wire types ---------------------------------------------------------------------------------------
class RLLMAction(Action):
    """One LLM turn."""

    message: str = Field(max_length=MAX_TEXT_LENGTH, description="the text of one LLM turn")
    opponent_message: str | None = Field(
        None, max_length=MAX_TEXT_LENGTH,
        description="social games served without a baseline opponent: the other seat's turn",
    )  # fmt: skip


class RLLMObservation(Observation):
    """The env's reply; ``reward`` and ``done`` are OpenEnv's base fields."""

    text: str = Field("", description="the env's observation text (empty once the episode is over)")
    system_prompt: str = Field("", description="the env's system prompt for this episode")
    task_id: str | None = Field(None, description="the episode's task id")
    stop: list[str] = Field(default_factory=list, description="stop strings a generator should use")
    info: dict[str, Any] = Field(default_factory=dict, description="rl-llm's reset/step info (JSON-safe)")


def observation_fields(text: str, episode: Episode, info: dict[str, Any], done: bool, reward: float | None
                       ) -> dict[str, Any]:  # fmt: skip
    """An ``RLLMObservation``'s fields, every value already of its field's type, so building the model is
    validation that changes nothing and ``wire_form`` writes what openenv-core would write of the model."""
    return {"text": text, "system_prompt": episode.system_prompt, "task_id": episode.task_id, "stop": episode.stop,
            "info": info, "done": done, "reward": reward}  # fmt: skip


def wire_form(fields: dict[str, Any]) -> dict[str, Any]:
    """What openenv-core's ``serialize_observation`` returns for ``RLLMObservation(**fields)``: the observation's
    fields but reward, done and metadata (in the model's order), then reward and done. The fast paths' replies
    are compared byte for byte with openenv-core's (tests/integrations/test_openenv.py)."""
    return {"observation": {name: fields[name] for name in _OBSERVED}, "reward": fields["reward"], "done": fields["done"]}


_OBSERVED = [name for name in RLLMObservation.model_fields if name not in ("reward", "done", "metadata")]


class RLLMState(State):
    env_id: str = ""
    task_id: str | None = None
    done: bool = True
    total_reward: float = 0.0


# -- episodes kept for plain HTTP ----------------------------------------------------------------------------
@dataclass
class Episode:
    env: gym.Env
    env_id: str
    task_id: str | None = None
    system_prompt: str = ""
    stop: list[str] = field(default_factory=list)
    done: bool = False
    steps: int = 0
    total_reward: float = 0.0
    last_used: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)  # held by the step running on it
    retired: bool = False  # out of the store: its env is closed as soon as no step runs on it
    closed: bool = False

    def retire(self) -> None:
        """Close the env now, or, while a step of it runs, when that step ends (``_step`` calls this again).
        A reset of the same ``episode_id`` mid-step used to close the env under the running step."""
        self.retired = True
        if self.lock.acquire(blocking=False):
            try:
                if not self.closed:
                    self.closed = True
                    _close_quietly(self.env)
            finally:
                self.lock.release()


class EpisodeStore:
    """Episodes addressed by ``episode_id`` across stateless HTTP requests; bounded in count and idle time.

    Envs of evicted or replaced episodes are closed here; an ended episode stays until evicted so ``/state``
    and a late duplicate step still get an answer.
    """

    def __init__(self, max_episodes: int = 256, ttl_s: float = 600.0) -> None:
        # 0 evicted every episode as it began (each step a 404); a NaN TTL never expired one
        self.max_episodes = checks.integer("max_episodes", max_episodes, minimum=1)
        self.ttl_s = checks.seconds("episode_ttl_s", ttl_s)
        self._episodes: OrderedDict[str, Episode] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, episode_id: str, episode: Episode) -> None:
        with self._lock:
            old = self._episodes.pop(episode_id, None)
            self._episodes[episode_id] = episode
            evicted = self._expire_locked()
        for stale in ([old] if old is not None and old.env is not episode.env else []) + evicted:
            stale.retire()

    def get(self, episode_id: str) -> Episode:
        with self._lock:
            evicted = self._expire_locked()
            episode = self._episodes.get(episode_id)
            if episode is not None:
                self._episodes.move_to_end(episode_id)
                episode.last_used = time.monotonic()
        for stale in evicted:
            stale.retire()
        if episode is None:
            raise HTTPException(404, f"unknown episode_id {episode_id!r} (expired, evicted or never reset)")
        return episode

    def owns(self, env: gym.Env) -> bool:
        with self._lock:
            return any(episode.env is env for episode in self._episodes.values())

    def _expire_locked(self) -> list[Episode]:
        # The dict is in least-recently-used order (``put`` appends, ``get`` moves to the end), so only its front
        # can be over the count or the TTL: stop at the first episode that is neither. Scanning all of them on
        # every request made a call cost O(episodes) (docs/serving.md#measurements).
        now, evicted = time.monotonic(), []
        for _ in range(len(self._episodes)):
            episode_id, episode = next(iter(self._episodes.items()))
            if len(self._episodes) <= self.max_episodes and now - episode.last_used <= self.ttl_s:
                break
            if episode.lock.locked():  # mid-step: keep it, as most recently used
                self._episodes.move_to_end(episode_id)
                continue
            evicted.append(self._episodes.pop(episode_id))
        return evicted

    def close(self) -> None:
        with self._lock:
            episodes, self._episodes = list(self._episodes.values()), OrderedDict()
        for episode in episodes:
            episode.retire()


def _check_episode_id(episode_id: Any) -> None:
    # /step's body and a /ws reset's data take any extra field untyped, so an episode_id may be a list or an
    # object: as a key of the store that raised TypeError (unhashable), a bare 500 over HTTP.
    if episode_id is not None and not isinstance(episode_id, str):
        raise HTTPException(422, f"episode_id must be a string, got {type(episode_id).__name__}")


def _close_quietly(env: gym.Env) -> None:
    # A failing close must not take a request (or the server's shutdown) down with it.
    with contextlib.suppress(Exception):
        env.close()


# -- the OpenEnv Environment -----------------------------------------------------------------------------------
class RLLMEnvironment(Environment[RLLMAction, RLLMObservation, RLLMState]):
    """One OpenEnv session around one rl-llm env (built lazily, on the first reset that needs it)."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # every session builds its own env; nothing mutable is shared

    def __init__(
        self, env_id: str, env_kwargs: dict[str, Any] | None = None, store: EpisodeStore | None = None,
        inline: InlinePolicy | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        self.store = store or EpisodeStore()
        self.inline = inline or InlinePolicy()
        self._env: gym.Env | None = None
        self._episode: Episode | None = None

    # reset(seed, episode_id, **kwargs) / step(action, timeout_s, **kwargs): OpenEnv passes only the request
    # fields these signatures name, so ``options`` and ``episode_id`` reach us from /reset, /step and /ws. Since
    # they take ``**_``, OpenEnv passes every other field too (its requests allow extra fields): ``self`` is
    # positional-only so that a request field named "self" lands in ``**_`` instead of raising TypeError (a
    # bare 500 over HTTP).
    def reset(self, /, seed: int | None = None, episode_id: str | None = None, options: dict[str, Any] | None = None,
              **_: Any) -> RLLMObservation:  # fmt: skip
        return RLLMObservation(**self._reset(seed, episode_id, options))

    def _reset(self, seed: int | None, episode_id: str | None, options: dict[str, Any] | None) -> dict[str, Any]:
        if options is not None and not isinstance(options, dict):
            raise HTTPException(400, f"options must be a JSON object, got {type(options).__name__}")
        _check_episode_id(episode_id)
        if self._env is None:
            self._env = self._build()
        try:
            text, info = self._env.reset(seed=seed, options=options)
        except (ValueError, TypeError, KeyError) as error:
            raise HTTPException(400, f"reset rejected: {error}") from None
        task_id = info.get("task_id")
        self._episode = Episode(
            self._env, self.env_id, task_id=None if task_id is None else str(task_id),
            system_prompt=str(info.get("system_prompt", "")), stop=[str(s) for s in info.get("stop", [])],
        )  # fmt: skip
        if episode_id is not None:
            self.store.put(episode_id, self._episode)
            self._env = None  # the store owns it now; a later reset of this session builds a fresh env
        return observation_fields(str(text), self._episode, jsonable(info), done=False, reward=None)

    def step(self, /, action: RLLMAction, timeout_s: float | None = None, episode_id: str | None = None,
             **_: Any) -> RLLMObservation:  # fmt: skip
        return RLLMObservation(**self._step(action, episode_id))

    def _step(self, action: RLLMAction, episode_id: str | None) -> dict[str, Any]:
        _check_episode_id(episode_id)
        episode = self.store.get(episode_id) if episode_id is not None else self._episode
        if episode is None:
            raise HTTPException(409, "no episode running: reset first (over plain HTTP, pass the same episode_id to "
                                     "/reset and /step, or use the WebSocket /ws)")  # fmt: skip
        if not episode.lock.acquire(blocking=False):
            raise HTTPException(409, "this episode is busy with another step")
        try:
            if episode.done:
                raise HTTPException(409, "the episode has ended; reset to start another")
            extra = {}
            if action.opponent_message is not None:
                if not isinstance(episode.env.unwrapped, SocialSeat):
                    raise HTTPException(
                        400, "opponent_message is only for social games (env ids social/<game>)"
                    )
                extra["opponent_action"] = action.opponent_message
            return self._play(episode, action.message, **extra)
        finally:
            episode.lock.release()
            if episode.retired:  # replaced or evicted while this step ran: its env closes now
                episode.retire()

    # OpenEnv awaits these on its event loop when an env defines them (instead of a thread hop per call): a
    # call kind proven cheap runs inline, watched; the rest go to a worker (docs/serving.md#inline-calls).
    async def reset_async(self, /, seed: int | None = None, episode_id: str | None = None,
                          options: dict[str, Any] | None = None, **_: Any) -> RLLMObservation:  # fmt: skip
        claim_for_connection(self)
        return RLLMObservation(**await self._run("reset", lambda: self._reset(seed, episode_id, options)))

    async def step_async(self, /, action: RLLMAction, timeout_s: float | None = None, episode_id: str | None = None,
                         **_: Any) -> RLLMObservation:  # fmt: skip
        claim_for_connection(self)
        return RLLMObservation(**await self._run("step", lambda: self._step(action, episode_id)))

    # The fast paths' twins of the two above: the same calls, answered in openenv-core's wire form
    # (``serialize_observation`` of the observation) without building the pydantic observation and dumping it
    # again, about a fifth of a cheap call in-process (docs/serving.md#openenv-websocket-sessions).
    async def reset_wire(self, /, seed: int | None = None, episode_id: str | None = None,
                         options: dict[str, Any] | None = None, **_: Any) -> dict[str, Any]:  # fmt: skip
        return wire_form(await self._run("reset", lambda: self._reset(seed, episode_id, options)))

    async def step_wire(self, /, action: RLLMAction, timeout_s: float | None = None, episode_id: str | None = None,
                        **_: Any) -> dict[str, Any]:  # fmt: skip
        return wire_form(await self._run("step", lambda: self._step(action, episode_id)))

    async def _run(self, what: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        kind = (self.env_id, what)
        if self.inline.inline(kind):
            return self.inline.run(kind, f"openenv {what}", fn)[0]
        result, elapsed, cpu = await asyncio.to_thread(timed, fn)
        self.inline.pooled(kind, elapsed, cpu)
        return result

    def _play(self, episode: Episode, message: str, **extra: Any) -> dict[str, Any]:
        try:
            text, reward, terminated, truncated, info = episode.env.step(message, **extra)
        except (ValueError, TypeError) as error:
            raise HTTPException(400, f"step rejected: {error}") from None
        episode.done = bool(terminated or truncated)
        episode.steps += 1
        episode.total_reward += float(reward)
        episode.last_used = time.monotonic()
        info = {"task_id": episode.task_id, **step_info(bool(terminated), bool(truncated), info)}
        return observation_fields(str(text), episode, info, done=episode.done, reward=float(reward))

    @property
    def state(self) -> RLLMState:
        episode = self._episode
        if episode is None:
            return RLLMState(env_id=self.env_id)
        return RLLMState(
            env_id=self.env_id, task_id=episode.task_id, done=episode.done, total_reward=episode.total_reward,
            step_count=episode.steps,
        )  # fmt: skip

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name=self.env_id, description=f"rl-llm environment {self.env_id} with kwargs {self.env_kwargs}",
            version="0", author="rl-llm",
        )  # fmt: skip

    def close(self) -> None:
        # OpenEnv closes the env after every plain-HTTP request: an episode parked in the store lives on.
        if self._env is not None and not self.store.owns(self._env):
            _close_quietly(self._env)
        self._env = None

    def _build(self) -> gym.Env:
        try:
            return make_env(self.env_id, **self.env_kwargs)
        except (ValueError, TypeError) as error:
            raise HTTPException(
                400, f"cannot build {self.env_id} with kwargs {self.env_kwargs}: {error}"
            ) from None


# openenv-core reads these signatures (``inspect.signature``) on every plain-HTTP request and every ``/ws``
# reset, to pick the request fields a method takes; reading them fresh cost 13.5 us a call, a tenth of a whole
# plain-HTTP step. A function's ``__signature__`` is what ``inspect.signature`` returns for it (PEP 362).
for _method in (RLLMEnvironment.reset, RLLMEnvironment.step, RLLMEnvironment.reset_async, RLLMEnvironment.step_async):
    _method.__signature__ = inspect.signature(_method)  # type: ignore[attr-defined]


def environment_factory(env_id: str, env_kwargs: dict[str, Any] | None = None,
                        store: EpisodeStore | None = None) -> Callable[[], RLLMEnvironment]:  # fmt: skip
    """The factory ``create_app`` calls once per session and per plain-HTTP request (all share one store and
    one inline policy)."""
    shared, inline = store or EpisodeStore(), InlinePolicy()

    def factory() -> RLLMEnvironment:
        return RLLMEnvironment(env_id, env_kwargs, shared, inline)

    return factory


def create_openenv_app(env_id: str, env_kwargs: dict[str, Any] | None = None, max_sessions: int = 64,
                       max_episodes: int = 256, episode_ttl_s: float = 600.0, fast_path: bool = True,
                       max_body_bytes: int = MAX_BODY_BYTES) -> Any:  # fmt: skip
    """openenv-core's ``create_app`` serving ``env_id``; the env is built once here so a bad id or kwargs fail now.
    Well-formed plain-HTTP resets and steps are answered ahead of its routes, the same way (``plain_http_routes``;
    ``fast_path=False`` leaves every request to openenv-core's routes)."""
    from openenv.core.env_server.http_server import create_app

    # Checked before the env is built and openenv-core is set up: max_sessions=0 failed there as a pydantic
    # traceback; a list of kwargs as "dictionary update sequence element #0 ...".
    if env_kwargs is not None and not isinstance(env_kwargs, Mapping):
        raise ValueError(f"env_kwargs must be a dict of the env's keyword arguments, got {type(env_kwargs).__name__}")
    checks.integer("max_sessions", max_sessions, minimum=1)
    checks.integer("max_body_bytes", max_body_bytes, minimum=1)
    store = EpisodeStore(max_episodes, episode_ttl_s)
    make_env(env_id, **dict(env_kwargs or {})).close()
    factory = environment_factory(env_id, env_kwargs, store)
    app = create_app(factory, RLLMAction, RLLMObservation, env_name=env_id, max_concurrent_envs=max_sessions)
    app.router.on_shutdown.append(store.close)
    app.add_middleware(OpenEnvSocket, action_cls=RLLMAction if fast_path else None)
    if fast_path:
        app.add_middleware(FastRoutes, routes=plain_http_routes(factory))
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)  # added last: the outermost (fast_routes.py)
    answer_validation_errors_safely(app)
    return app


def plain_http_routes(factory: Callable[[], RLLMEnvironment]) -> list[FastRoute]:
    """OpenEnv's ``POST /reset`` and ``POST /step`` as openenv-core's routes run them for an env with
    ``reset_async``/``step_async`` (a fresh env from ``factory`` per request, the request's fields as keyword
    arguments, closed after; what its ``ResetResponse``/``StepResponse`` write as the reply), without FastAPI's
    per-request cost (docs/serving.md#fast-routes). A request openenv-core's models refuse is left to its route."""
    from openenv.core.env_server.serialization import deserialize_action
    from openenv.core.env_server.types import ResetRequest, StepRequest

    def parse_step(body: dict[str, Any], _: re.Match[str]) -> tuple[RLLMAction, dict[str, Any]]:
        request = StepRequest.model_validate(body)
        return deserialize_action(request.action, RLLMAction), request.model_dump(exclude_unset=True, exclude={"action"})

    def answer(call: Callable[[RLLMEnvironment, Any], Any]) -> Any:
        async def run(arguments: Any) -> bytes:
            env = factory()
            try:  # the wire form is ResetResponse's and StepResponse's fields, in their order
                return to_json(await call(env, arguments), inf_nan_mode="null")
            finally:
                env.close()

        return run

    def parse_reset(body: dict[str, Any], _: re.Match[str]) -> dict[str, Any]:
        return ResetRequest.model_validate(body).model_dump(exclude_unset=True)

    return [
        FastRoute(re.compile("/reset"), parse_reset, answer(lambda env, kwargs: env.reset_wire(**kwargs))),
        FastRoute(re.compile("/step"), parse_step, answer(lambda env, args: env.step_wire(args[0], **args[1]))),
    ]  # fmt: skip


def parse_kwargs(pairs: list[str]) -> dict[str, Any]:
    """``["opponent=minimax", "max_turns=5"]`` -> ``{"opponent": "minimax", "max_turns": 5}`` (values as JSON
    when they parse, else strings)."""
    try:
        return parse_kwarg_pairs(pairs)
    except ValueError as error:
        raise SystemExit(str(error)) from None


def main(argv: list[str] | None = None) -> None:
    from rl_llm.integrations.http_server import (
        add_address_flags,
        add_web_server_flags,
        max_body_bytes,
        run_web_server,
    )

    parser = ArgumentParser(description="Serve one rl-llm environment with OpenEnv's server.")
    parser.add_argument(
        "--env", required=True, help="rl-llm/<Name>-v0, or social/<game> for one seat of a social game"
    )
    parser.add_argument(
        "-k", "--kwarg", action="append", default=[], help="env keyword argument key=value (repeatable)"
    )
    add_address_flags(parser)
    parser.add_argument("--max-sessions", type=count_flag(), default=64, help="concurrent WebSocket sessions")
    parser.add_argument(
        "--episode-ttl-s", type=seconds_flag(), default=600.0, help="idle life of a plain-HTTP episode"
    )
    parser.add_argument("--max-episodes", type=count_flag(), default=256, help="plain-HTTP episodes kept at once")
    add_web_server_flags(parser)
    args = parser.parse_args(argv)
    try:
        app = create_openenv_app(args.env, parse_kwargs(args.kwarg), args.max_sessions, args.max_episodes,
                                 args.episode_ttl_s, max_body_bytes=max_body_bytes(args))  # fmt: skip
    except (ValueError, TypeError) as error:  # a bad id or option: one line, not a traceback
        raise SystemExit(f"error: cannot serve {args.env}: {error}") from None
    run_web_server(app, args)


if __name__ == "__main__":
    main()
