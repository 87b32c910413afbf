"""An HTTP server that lets any language or trainer drive rl-llm environments remotely.

Each session owns one env. Env work (construction, reset, step, close) runs in a thread pool, off the event
loop, under a per-request timeout: a step that does not return in time answers 504 and its session is closed
(the env's ``close()`` runs as soon as the stuck call returns, since a running thread cannot be killed).
Sessions idle longer than ``session_ttl_s`` are closed by a reaper, so a client that disappears leaks nothing.

Endpoints (JSON):

==========================  ========================================================================
``POST /sessions``          ``{env_id, kwargs?, count?}`` -> ``{session_ids}``
``POST /sessions/{id}/reset``  ``{seed?, options?}`` -> ``{observation, info, messages}``
``POST /sessions/{id}/step``   ``{action}`` or ``{messages}`` -> ``{observation, reward, terminated, truncated, done, info, messages}``
``DELETE /sessions/{id}``   closes the session's env
``POST /batch/reset``       ``{items: [{session_id, seed?, options?}]}`` -> ``{results}`` (per-item ``error``)
``POST /batch/step``        ``{items: [{session_id, action}]}`` -> ``{results}`` (per-item ``error``)
``WS /sessions/ws``         one session per connection: ``create``/``attach``, ``reset``, ``step``, ``close`` (``ws_sessions.py``)
``GET /envs``, ``GET /stats``, ``GET /health``
==========================  ========================================================================

Cheap env calls run inline on the event loop once they have proved cheap, with a watchdog; slow ones stay on
the pool (``inline_calls.py``, docs/serving.md#inline-calls); well-formed resets and steps skip FastAPI's
routing (``fast_routes.py``, the same replies). Session ids start with the server's instance id, so a client
whose server restarted gets a 404 naming the lost session (docs/serving.md#faults).

Errors are ``{"detail": ...}`` with 400 (bad env id, kwargs or options), 404 (unknown or closed session),
409 (session busy, or stepping an ended episode), 422 (malformed body), 429 (``max_sessions`` reached) or
503 (more than ``max_queued`` env calls waiting), both with ``Retry-After``, 504 (env call timed out; session
closed) or 500 (env raised; session closed).

Run it with ``python -m rl_llm.integrations.http_server --port 8000``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import gymnasium as gym
from fastapi import FastAPI, HTTPException, WebSocket
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rl_llm import checks
from rl_llm.console import (
    ArgumentParser,
    count_flag,
    flag_type,
    host_flag,
    port_flag,
    seconds_flag,
)
from rl_llm.envs.base import MAX_TEXT_LENGTH
from rl_llm.envs.registration import env_ids
from rl_llm.integrations.fast_routes import (
    MAX_BODY_BYTES,
    BodyLimit,
    FastRoute,
    FastRoutes,
    answer_validation_errors_safely,
    encode_strict,
)
from rl_llm.integrations.generic import EnvFactory, action_from, jsonable, step_info
from rl_llm.integrations.inline_calls import InlinePolicy, LoopBatch, timed
from rl_llm.integrations.ws_sessions import serve_session

T = TypeVar("T")
RETRY_AFTER = {"Retry-After": "1"}
MakeEnv = Callable[[str, dict[str, Any]], gym.Env]


# -- request bodies ------------------------------------------------------------------------------------------
class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


# The whole numbers (count, seed) are strict: lax pydantic took true, "5" and 5.0 as numbers, a client's
# mistake played as another request's seed. The WebSocket's messages use these models too (ws_sessions.py).
class CreateRequest(_Body):
    env_id: str
    kwargs: dict[str, Any] = Field(default_factory=dict)
    count: int = Field(1, ge=1, le=1024, strict=True)


class AttachRequest(_Body):
    """The WebSocket's ``attach``: the id of a session opened elsewhere."""

    session_id: str


class CloseRequest(_Body):
    """The WebSocket's ``close``: no fields (an unknown one is refused, as in every other message)."""


class ResetRequest(_Body):
    # Gymnasium's seeding refuses negative seeds: a 422 here, not a lost session
    seed: int | None = Field(None, ge=0, strict=True)
    options: dict[str, Any] | None = None


class ChatMessage(_Body):
    role: str
    content: str = Field(max_length=MAX_TEXT_LENGTH)


class StepRequest(_Body):
    action: str | None = Field(None, max_length=MAX_TEXT_LENGTH)
    messages: list[ChatMessage] | None = None

    @model_validator(mode="after")
    def _one_action(self) -> StepRequest:
        if (self.action is None) == (self.messages is None):
            raise ValueError("give exactly one of 'action' (the turn's text) or 'messages' (ending with the assistant turn)")
        return self

    def action_text(self) -> str:
        if self.action is not None:
            return self.action
        try:
            return action_from([message.model_dump() for message in self.messages or []])
        except (ValueError, TypeError) as error:
            raise HTTPException(422, str(error)) from None


class BatchResetItem(ResetRequest):
    session_id: str


class BatchStepItem(StepRequest):
    session_id: str


class BatchResetRequest(_Body):
    items: list[BatchResetItem] = Field(max_length=4096)


class BatchStepRequest(_Body):
    items: list[BatchStepItem] = Field(max_length=4096)


# -- server state ----------------------------------------------------------------------------------------------
@dataclass
class ServerConfig:
    """Limits of an :class:`EnvServer`. ``allowed_env_ids=None`` allows every registered rl-llm env."""

    allowed_env_ids: frozenset[str] | None = None
    max_sessions: int = 512
    step_timeout_s: float = 60.0
    create_timeout_s: float = 120.0
    session_ttl_s: float = 600.0
    reap_interval_s: float = 5.0
    max_workers: int = 32
    # Pool calls waiting or running beyond this answer 503 with Retry-After instead of queueing without bound.
    max_queued: int = 1024
    # Cheap env calls run inline on the event loop (docs/serving.md#inline-calls); 0 keeps every call on the pool.
    inline_budget_s: float = 0.001
    # Reset and step answered ahead of FastAPI's routing, the same replies (docs/serving.md#fast-routes).
    fast_routes: bool = True
    # Request bodies past this are answered 413 and never held whole (fast_routes.BodyLimit).
    max_body_bytes: int = MAX_BODY_BYTES

    def __post_init__(self) -> None:
        # Checked here, not where used: max_sessions=0 or a NaN step timeout made a server that refused or timed
        # out every request, a NaN session_ttl_s one that never reaped, max_workers=0 a ThreadPoolExecutor error.
        for name in ("max_sessions", "max_workers", "max_queued", "max_body_bytes"):
            checks.integer(name, getattr(self, name), minimum=1)
        for name in ("step_timeout_s", "create_timeout_s", "session_ttl_s", "reap_interval_s"):
            setattr(self, name, checks.seconds(name, getattr(self, name)))
        self.inline_budget_s = checks.seconds("inline_budget_s", self.inline_budget_s, allow_zero=True)
        if self.allowed_env_ids is not None:
            # a plain string was searched as text: "rl" counted as allowed inside "rl-llm/TicTacToe-v0"
            ids = self.allowed_env_ids
            if isinstance(ids, str) or not all(isinstance(env_id, str) for env_id in ids):
                raise ValueError(f"allowed_env_ids must be a set of env id strings (or None for all), got {ids!r}")
            self.allowed_env_ids = frozenset(ids)


@dataclass
class Session:
    id: str
    env_id: str
    env: gym.Env
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False
    episode_over: bool = True
    running: Future[Any] | None = None  # the latest env call submitted for this session


@dataclass
class ServerStats:
    envs_created: int = 0
    envs_closed: int = 0
    close_errors: int = 0
    timeouts: int = 0
    reaped: int = 0
    inline_calls: int = 0
    pool_calls: int = 0
    overloaded: int = 0  # pool calls refused with 503


class CallTimedOut(Exception):
    """An env call ran past its time limit (and goes on in its thread). Not ``TimeoutError``, which an env may
    raise itself, e.g. when it cannot get a sandbox in time: that is an env error, not a timeout here."""


class EnvServer:
    """The session table and the FastAPI app around it (``server.app``)."""

    def __init__(self, config: ServerConfig | None = None, make_env: MakeEnv | None = None) -> None:
        self.config = config or ServerConfig()
        self.make_env = make_env or (lambda env_id, kwargs: EnvFactory(env_id, **kwargs)())
        self.sessions: dict[str, Session] = {}
        self.stats = ServerStats()
        self._reserved = 0  # sessions being constructed, counted against max_sessions
        self._stats_lock = threading.Lock()  # close() runs on pool threads
        self._executor = ThreadPoolExecutor(self.config.max_workers, thread_name_prefix="rl-llm-env")
        self._queued = 0  # pool calls submitted and not yet answered
        # Session ids start with this, so after a restart a client's old id gets a 404 that says so.
        self.instance_id = uuid.uuid4().hex[:8]
        self.inline_policy = InlinePolicy(budget_s=self.config.inline_budget_s)
        self.ws_batch = LoopBatch()  # the WebSocket sessions' inline calls (inline_calls.py)
        self.app = self._build_app()

    # -- env calls in the pool, with a timeout ---------------------------------------------------------------
    async def _call(self, future: Future[T], timeout: float, on_late: Callable[[Future[T]], None]) -> T:
        """Await a pool call; past ``timeout`` raise ``CallTimedOut`` and run ``on_late(future)`` once the stuck
        call finally returns."""
        done, _ = await asyncio.wait([asyncio.wrap_future(future)], timeout=timeout)
        if not done:
            with self._stats_lock:
                self.stats.timeouts += 1
            future.add_done_callback(on_late)
            raise CallTimedOut
        return done.pop().result()  # the asyncio side's result: retrieving it keeps asyncio from logging it

    def _close_env(self, env: gym.Env) -> None:
        try:
            env.close()
        except Exception:
            with self._stats_lock:
                self.stats.close_errors += 1
        with self._stats_lock:
            self.stats.envs_closed += 1

    def _drop(self, session: Session, wait: bool = False) -> None:
        """Forget a session and close its env: on a pool thread (here if ``wait``), or, while a call of it is
        still running, on that call's thread as soon as it returns (a running thread cannot be killed)."""
        if self.sessions.pop(session.id, None) is None:
            return
        if session.running is not None and not session.running.done():
            session.running.add_done_callback(lambda _: self._close_env(session.env))
        elif wait:
            self._close_env(session.env)
        else:
            self._executor.submit(self._close_env, session.env)

    def session(self, session_id: str) -> Session:
        """The live session ``session_id``, or a 404 that says why it is gone where the id tells."""
        session = self.sessions.get(session_id)
        if session is not None:
            return session
        instance = session_id.partition("-")[0] if "-" in session_id else None
        if instance is not None and instance != self.instance_id:
            raise HTTPException(
                404, f"unknown session id {session_id!r}: it was opened on server instance {instance}, and this is "
                f"instance {self.instance_id} (the server restarted); that session and its episode are lost",
            )  # fmt: skip
        raise HTTPException(404, f"unknown session id {session_id!r} (closed, expired or never created)")

    def forget(self, session_id: str) -> None:
        """Close a session if it is still open (a WebSocket that created it went away)."""
        session = self.sessions.get(session_id)
        if session is not None:
            self._drop(session)

    def _session(self, session_id: str) -> Session:
        session = self.session(session_id)
        if session.busy:
            raise HTTPException(409, f"session {session_id!r} is busy with another request")
        return session

    async def _run_in_session(self, session: Session, fn: Callable[[], T], what: str, batched: bool = False) -> T:
        """Run an env call for ``session``, inline if its kind has proved cheap (``batched``: in the loop's next
        ``LoopBatch`` with other connections' calls), else on the pool; timeouts and unexpected env errors close
        the session."""
        kind = (session.env_id, what)
        inline = self.inline_policy.inline(kind)
        if not inline and self._queued >= self.config.max_queued:
            self.stats.overloaded += 1
            raise HTTPException(503, f"server busy: {self._queued} env calls queued; retry", headers=RETRY_AFTER)
        session.busy = True
        try:
            if inline and batched:
                return await self.ws_batch.run(lambda: self._run_inline(session, fn, kind))
            if inline:
                return self._run_inline(session, fn, kind)
            self._queued += 1
            self.stats.pool_calls += 1
            session.running = self._executor.submit(timed, fn)
            try:
                result, elapsed, cpu = await self._call(session.running, self.config.step_timeout_s, lambda _: None)
            finally:
                self._queued -= 1
            self.inline_policy.pooled(kind, elapsed, cpu)
            return result
        except CallTimedOut:
            self._drop(session)  # its env is closed once the stuck call returns
            raise HTTPException(
                504, f"{what} timed out after {self.config.step_timeout_s:g}s; session {session.id!r} was closed"
            ) from None
        except (ValueError, TypeError, gym.error.Error) as error:  # the caller's input (Gymnasium's own checks too)
            raise HTTPException(400, f"{what} rejected: {error}") from None
        except Exception as error:
            self._drop(session)
            raise HTTPException(500, f"{what} failed: {type(error).__name__}: {error}; session closed") from None
        finally:
            session.busy = False
            session.last_used = time.monotonic()

    def _run_inline(self, session: Session, fn: Callable[[], T], kind: tuple[str, str]) -> T:
        """Run a cheap call on the loop, timed and watched: over the budget it demotes its kind to the pool;
        over the call timeout it is answered like a pooled call that timed out (504, session closed)."""
        self.stats.inline_calls += 1
        result, elapsed = self.inline_policy.run(kind, session.id, fn)
        if elapsed > self.config.step_timeout_s:
            with self._stats_lock:
                self.stats.timeouts += 1
            raise CallTimedOut
        return result

    # -- operations -------------------------------------------------------------------------------------------
    def allowed(self) -> list[str]:
        return sorted(self.config.allowed_env_ids) if self.config.allowed_env_ids is not None else env_ids()

    async def create(self, request: CreateRequest) -> list[str]:
        if request.env_id not in self.allowed():
            raise HTTPException(400, f"env_id {request.env_id!r} is not served here; choose from {self.allowed()}")
        if len(self.sessions) + self._reserved + request.count > self.config.max_sessions:
            raise HTTPException(
                429, f"max_sessions={self.config.max_sessions} reached ({len(self.sessions)} open); close sessions first",
                headers=RETRY_AFTER,
            )
        self._reserved += request.count
        try:
            envs = await asyncio.gather(
                *(self._create_env(request.env_id, request.kwargs) for _ in range(request.count)),
                return_exceptions=True,
            )
        finally:
            self._reserved -= request.count
        failures = [env for env in envs if isinstance(env, BaseException)]
        if failures:  # all or nothing: close the ones that did get built
            for env in envs:
                if not isinstance(env, BaseException):
                    self._executor.submit(self._close_env, env)
            raise failures[0]
        ids = []
        for env in envs:
            session = Session(f"{self.instance_id}-{uuid.uuid4().hex}", request.env_id, env)
            self.sessions[session.id] = session
            ids.append(session.id)
        return ids

    async def _create_env(self, env_id: str, kwargs: dict[str, Any]) -> gym.Env:
        def build() -> gym.Env:
            env = self.make_env(env_id, kwargs)
            with self._stats_lock:
                self.stats.envs_created += 1
            return env

        try:
            return await self._call(self._executor.submit(build), self.config.create_timeout_s, self._close_late_env)
        except CallTimedOut:
            raise HTTPException(504, f"creating {env_id} timed out after {self.config.create_timeout_s:g}s") from None
        except (TypeError, ValueError) as error:
            raise HTTPException(400, f"cannot create {env_id} with kwargs {kwargs}: {error}") from None
        except Exception as error:
            raise HTTPException(500, f"creating {env_id} failed: {type(error).__name__}: {error}") from None

    def _close_late_env(self, future: Future[gym.Env]) -> None:
        if not future.cancelled() and future.exception() is None:
            self._close_env(future.result())

    async def reset(self, session_id: str, request: ResetRequest, batched: bool = False) -> dict[str, Any]:
        session = self._session(session_id)
        session.episode_over = True  # until this reset succeeds
        observation, info = await self._run_in_session(
            session, lambda: session.env.reset(seed=request.seed, options=request.options), "reset", batched
        )
        session.episode_over = False
        messages = [{"role": "system", "content": info.get("system_prompt", "")}, {"role": "user", "content": observation}]
        return {"session_id": session_id, "observation": observation, "info": jsonable(info), "messages": messages}

    async def step(self, session_id: str, request: StepRequest, batched: bool = False) -> dict[str, Any]:
        action = request.action_text()
        session = self._session(session_id)
        if session.episode_over:
            raise HTTPException(409, f"session {session_id!r} has no episode running (it ended or never started); reset it")
        observation, reward, terminated, truncated, info = await self._run_in_session(
            session, lambda: session.env.step(action), "step", batched
        )
        done = bool(terminated or truncated)
        session.episode_over = done
        return {
            "session_id": session_id,
            "observation": observation,
            "reward": float(reward),
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "done": done,
            "info": step_info(bool(terminated), bool(truncated), info),
            "messages": [] if done else [{"role": "user", "content": observation}],
        }

    async def close(self, session_id: str) -> None:
        self._drop(self._session(session_id))

    async def reap(self) -> int:
        """Close sessions idle for longer than ``session_ttl_s``; returns how many."""
        now = time.monotonic()
        expired = [s for s in self.sessions.values() if not s.busy and now - s.last_used > self.config.session_ttl_s]
        with self._stats_lock:  # counted first: whoever sees the sessions gone also sees why
            self.stats.reaped += len(expired)
        for session in expired:
            self._drop(session)
        return len(expired)

    async def _reaper(self) -> None:
        while True:
            await asyncio.sleep(self.config.reap_interval_s)
            await self.reap()

    def shutdown(self) -> None:
        """Close every session's env (after its running call, if one is stuck) and stop taking work."""
        for session in list(self.sessions.values()):
            self._drop(session, wait=True)
        self._executor.shutdown(wait=False)  # queued closes still run
        self.inline_policy.close()

    def snapshot(self) -> dict[str, Any]:
        with self._stats_lock:
            counts = dict(vars(self.stats))
        return {"instance_id": self.instance_id, "live_sessions": len(self.sessions), "queued": self._queued,
                "inline_demotions": self.inline_policy.demotions, **counts}  # fmt: skip

    # -- the app ----------------------------------------------------------------------------------------------
    def _build_app(self) -> FastAPI:
        @contextlib.asynccontextmanager
        async def lifespan(_: FastAPI) -> Any:
            reaper = asyncio.create_task(self._reaper())
            try:
                yield
            finally:
                reaper.cancel()
                self.shutdown()

        app = FastAPI(title="rl-llm env server", lifespan=lifespan)

        app.get("/health")(lambda: {"status": "ok"})
        app.get("/envs")(lambda: {"env_ids": self.allowed()})
        app.get("/stats")(self.snapshot)

        @app.post("/sessions")
        async def create(request: CreateRequest) -> dict[str, Any]:
            return {"session_ids": await self.create(request)}

        @app.post("/sessions/{session_id}/reset")
        async def reset(session_id: str, request: ResetRequest) -> Any:
            return _json(await self.reset(session_id, request))

        @app.post("/sessions/{session_id}/step")
        async def step(session_id: str, request: StepRequest) -> Any:
            return _json(await self.step(session_id, request))

        @app.delete("/sessions/{session_id}")
        async def close(session_id: str) -> dict[str, Any]:
            await self.close(session_id)
            return {"session_id": session_id, "closed": True}

        @app.websocket("/sessions/ws")
        async def session_ws(socket: WebSocket) -> None:
            await serve_session(self, socket)

        @app.post("/batch/reset")
        async def reset_batch(request: BatchResetRequest) -> Any:
            calls = [self.reset(item.session_id, item) for item in request.items]
            return _json({"results": await _gather_items(calls)})

        @app.post("/batch/step")
        async def step_batch(request: BatchStepRequest) -> Any:
            calls = [self.step(item.session_id, item) for item in request.items]
            return _json({"results": await _gather_items(calls)})

        if self.config.fast_routes:
            app.add_middleware(FastRoutes, routes=self._fast_routes())
        app.add_middleware(BodyLimit, max_bytes=self.config.max_body_bytes)  # added last: the outermost
        answer_validation_errors_safely(app)
        return app

    def _fast_routes(self) -> list[FastRoute]:
        """The reset and step routes above, answered ahead of FastAPI's routing (docs/serving.md#fast-routes)."""

        def route(verb: str, model: type[BaseModel], handler: Callable[[str, Any], Any]) -> FastRoute:
            async def answer(arguments: tuple[str, Any]) -> bytes:
                return _encoded(await handler(*arguments))

            return FastRoute(
                re.compile(f"/sessions/(?P<session_id>[^/]+)/{verb}"),
                lambda body, match: (match["session_id"], model.model_validate(body)), answer,
            )  # fmt: skip

        return [route("reset", ResetRequest, self.reset), route("step", StepRequest, self.step)]


def _json(content: dict[str, Any]) -> Any:
    """The reply, encoded here: a Response skips FastAPI's response-model validation and re-encoding, ~5% of a
    cheap call (docs/serving.md#inline-calls)."""
    return Response(_encoded(content), media_type="application/json")


def _encoded(content: dict[str, Any]) -> bytes:
    """A reply's bytes, for the routes and the fast routes alike. The content is JSON-safe already
    (``jsonable``); pydantic-core's encoder (FastAPI's own) writes a NaN or infinity, which strict JSON lacks,
    as null, and a lone surrogate as U+FFFD (``encode_strict``)."""
    return encode_strict(content)


async def _gather_items(calls: list[Any]) -> list[dict[str, Any]]:
    """Run batch items concurrently; a failed item becomes ``{"error": {status, detail}}``, the rest succeed."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    out = []
    for result in results:
        if isinstance(result, HTTPException):
            out.append({"error": {"status": result.status_code, "detail": result.detail}})
        elif isinstance(result, BaseException):
            out.append({"error": {"status": 500, "detail": f"{type(result).__name__}: {result}"}})
        else:
            out.append(result)
    return out


# -- running it -----------------------------------------------------------------------------------------------
class BackgroundServer:
    """Serve an app with uvicorn on a daemon thread (``port=0`` picks a free port); ``url`` once started."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, name="rl-llm-env-server", daemon=True)
        self.url = ""

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the env server did not start (is the port in use?)")
            time.sleep(0.01)
        host, port = self._server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description="Serve rl-llm environments over HTTP.")
    add_address_flags(parser)
    parser.add_argument("--env", action="append", dest="envs", type=env_id_flag,
                        help="env id to serve (repeatable; default: all)")
    defaults = ServerConfig()
    for name in ("max_sessions", "step_timeout_s", "session_ttl_s", "max_workers"):
        kind = seconds_flag() if name.endswith("_s") else count_flag()
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=getattr(defaults, name))
    add_web_server_flags(parser)
    args = parser.parse_args(argv)
    config = ServerConfig(
        allowed_env_ids=frozenset(args.envs) if args.envs else None,
        max_sessions=args.max_sessions,
        step_timeout_s=args.step_timeout_s,
        session_ttl_s=args.session_ttl_s,
        max_workers=args.max_workers,
        max_body_bytes=max_body_bytes(args),
    )
    run_web_server(EnvServer(config).app, args)


def add_address_flags(parser: argparse.ArgumentParser) -> None:
    """``--host`` and ``--port``, checked as parsed: uvicorn bound port 70000 as 4464 (modulo 65536) and met a
    bad host with a traceback."""
    parser.add_argument("--host", type=host_flag, default="127.0.0.1", help="bind address (default: loopback only)")
    parser.add_argument("--port", type=port_flag, default=8000, help="TCP port, 0 to 65535 (0: any free one)")


def env_id_flag(env_id: str) -> str:
    """A registered env id: an unknown one was served anyway, every session of it refused."""
    if env_id not in env_ids():
        raise argparse.ArgumentTypeError(f"unknown env id {env_id!r}; choose from {env_ids()}")
    return env_id


# A positive, finite number of MiB, at most 1 TiB: 0, NaN or inf exit 2 with argparse's one line naming the flag.
MIB_FLAG = flag_type(lambda name, value: checks.real(name, value, positive=True, maximum=2.0**20))


def add_web_server_flags(parser: argparse.ArgumentParser) -> None:
    """The uvicorn settings both env servers take (docs/serving.md#web-server-settings)."""
    parser.add_argument("--access-log", action="store_true",
                        help="log every request and WebSocket connection (off: it costs ~20%% of a call)")
    parser.add_argument("--loop", choices=["auto", *WEB_STACK_MODULES["loop"]], default="auto",
                        help="event loop (auto: uvloop where installed, as rl-llm[server] does; else asyncio's)")
    parser.add_argument("--http", choices=["auto", *WEB_STACK_MODULES["http"]], default="auto",
                        help="HTTP/1.1 parser (auto: httptools where installed, as rl-llm[server] does; else h11)")
    parser.add_argument("--max-body-mb", type=MIB_FLAG, default=MAX_BODY_BYTES / 2**20,
                        help="largest HTTP request body read, in MiB; a larger one is answered 413 (default %(default)g)")
    parser.add_argument(
        "--ws-compression", action="store_true",
        help="negotiate permessage-deflate on WebSocket sessions (off: for small JSON messages on a LAN it costs "
             "more CPU and memory per connection than it saves)",
    )  # fmt: skip


# uvicorn's choices for the two flags above, and the module each needs (None: the standard library's).
WEB_STACK_MODULES: dict[str, dict[str, str | None]] = {
    "loop": {"asyncio": None, "uvloop": "uvloop"},
    "http": {"h11": "h11", "httptools": "httptools"},
}


def max_body_bytes(args: argparse.Namespace) -> int:
    """``--max-body-mb`` (checked by its argparse type) in bytes."""
    return max(1, int(args.max_body_mb * 2**20))


def web_server_options(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn's keyword arguments for the flags of ``add_web_server_flags``; a loop or parser that is named
    but not installed stops here with the command that installs it, not in uvicorn with a traceback."""
    import importlib.util

    for setting in ("loop", "http"):
        module = WEB_STACK_MODULES[setting].get(getattr(args, setting))
        if module is not None and importlib.util.find_spec(module) is None:
            raise SystemExit(f"error: --{setting} {getattr(args, setting)} needs the {module} package: "
                             f"pip install 'rl-llm[server]'")  # fmt: skip
    return {"access_log": args.access_log, "ws_per_message_deflate": args.ws_compression, "loop": args.loop,
            "http": args.http}  # fmt: skip


def quiet_connections(record: logging.LogRecord) -> bool:
    """A filter for uvicorn's server log: drops the INFO lines it writes for every WebSocket connection
    (``"WebSocket /ws" [accepted]``, then the websockets library's ``connection open`` and ``connection
    closed`` on some ways a connection ends), which are an access log by another name: two or three lines per
    connection, thousands when 1,000 clients connect. ``--access-log`` keeps them; refusals (``403``), warnings and errors always pass."""
    if record.levelno != logging.INFO or not isinstance(record.msg, str):
        return True
    return record.msg not in ("connection open", "connection closed") and not record.msg.endswith('" [accepted]')


def run_web_server(app: Any, args: argparse.Namespace, **uvicorn_options: Any) -> None:
    """Serve ``app`` with uvicorn on ``args.host``/``args.port`` and the flags of ``add_web_server_flags``,
    until stopped, with the start-up heap frozen first.

    Why freeze: Python's full garbage collection walks every object it tracks, and a server process is mostly
    start-up objects that live as long as it does (modules, classes, the app: about 227,000 in the OpenEnv
    server, openenv-core's imports most of them, and 58,000 in the env server). Under load the OpenEnv server
    ran a full collection every second or so, each stopping the event loop, so every client at once, for
    100-140 ms (16 ms for the env server's heap). ``gc.freeze`` moves what is alive now out of the collector's
    sight for good; what sessions create later is collected as before, 10-26 ms a full collection
    (docs/serving.md#web-server-settings). Only for a process that is the server: frozen objects are never
    freed, so an app served in-process (``BackgroundServer``) leaves the heap alone."""
    import gc

    import uvicorn

    options = web_server_options(args)
    if not args.access_log:
        logging.getLogger("uvicorn.error").addFilter(quiet_connections)
    gc.collect()  # garbage now is not frozen with the rest
    gc.freeze()
    uvicorn.run(app, host=args.host, port=args.port, **options, **uvicorn_options)


def web_stack() -> str:
    """What uvicorn runs on here with the default ``auto`` settings, e.g. ``uvicorn 0.54.0, uvloop 0.23.0,
    httptools 0.9.0, websockets 17.4``: the servers' speed depends on it (docs/serving.md#web-server-settings)."""
    from importlib.metadata import PackageNotFoundError, version

    def named(package: str, fallback: str) -> str:
        try:
            return f"{package} {version(package)}"
        except PackageNotFoundError:
            return fallback

    return ", ".join([named("uvicorn", "no uvicorn"), named("uvloop", "asyncio's event loop (no uvloop)"),
                      named("httptools", "h11 (no httptools)"), named("websockets", "no websockets")])  # fmt: skip


if __name__ == "__main__":
    main()
