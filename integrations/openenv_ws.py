"""OpenEnv's session WebSocket ``/ws``: openenv-core's own handler, guarded, with its resets and steps answered
ahead of it.

openenv-core's handler owns the session: it creates the session's env when a client connects, answers every
kind of message (``reset``, ``step``, ``state``, ``mcp``, ``close``), and closes the env when the client goes.
``OpenEnvSocket`` is ASGI middleware that sits on the connection's ``receive``, so it sees each message before
the handler does, and does two things there:

- **Guard** the handler against messages that used to cost a session or a traceback (see ``guard``).
- **Answer** well-formed resets and steps itself, the way the handler answers them for an env with
  ``reset_async``/``step_async``: the same message models, the same env call, the reply its
  ``WSObservationResponse`` writes and its error replies. What it skips is Starlette's WebSocket layers and
  openenv-core's per-message work, which on the 2-core machine cost more than a cheap env's step
  (docs/serving.md#openenv-websocket-sessions); the env answers in the wire form directly
  (``RLLMEnvironment.reset_wire``/``step_wire``, tested to write the same bytes as the models). Everything
  else, and every message these models refuse, goes to the handler as it came, so every validation error is
  openenv-core's.

Which env is the session's: openenv-core does not say, so the middleware waits for the handler to call the
session env's ``reset_async`` or ``step_async`` (it does so in the connection's own task, where the middleware
has put a ``_Connection`` in a context variable; ``RLLMEnvironment`` calls ``claim_for_connection``). The
first reset of a connection therefore always goes through openenv-core; the rest of the connection's resets
and steps are answered here. One difference, unobservable from outside: openenv-core's per-session
``SessionInfo`` (last activity, step count) is not updated by the messages answered here; only its idle
reaper reads it, and ``create_openenv_app`` does not configure one.

While a message is answered here the handler is waiting in ``receive``, so the env is never called by both.
tests/integrations/test_openenv.py sends the same message sequences with the fast path on and off and
compares every reply.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from dataclasses import dataclass
from typing import Any

from openenv.core.env_server.serialization import deserialize_action
from openenv.core.env_server.types import WSErrorCode, WSErrorResponse, WSResetMessage, WSStepMessage
from pydantic import ValidationError
from pydantic_core import to_json

from rl_llm.integrations.fast_routes import Receive, Scope, Send, strict_json


@dataclass
class _Connection:
    env: Any = None  # the session's RLLMEnvironment, once openenv-core's handler has called it


_CONNECTION: contextvars.ContextVar[_Connection | None] = contextvars.ContextVar("rl_llm_openenv_ws", default=None)


def claim_for_connection(env: Any) -> None:
    """Called by the env's ``reset_async``/``step_async``: inside a ``/ws`` connection's task, the env whose
    methods openenv-core's handler calls is that session's env."""
    connection = _CONNECTION.get()
    if connection is not None and connection.env is None:
        connection.env = env


class OpenEnvSocket:
    """ASGI middleware around openenv-core's ``/ws`` (and its other WebSocket routes, guarded only).

    The guard, for what clients did there that used to cost a session or a traceback:

    - A client that has gone: openenv-core's handler closes the socket once a session ends; when the client had
      already closed it (every client that says goodbye and hangs up, and every one that drops), that close
      raised Starlette's ``WebSocketDisconnect``, which reached uvicorn as "Exception in ASGI application" with a
      traceback per session: log noise, and with 1,000 clients ending at once, CPU taken from the live ones
      (docs/serving.md#measurements). A disconnect is how a session ends, not an error, so it stops here.
    - JSON nested deeper than Python's recursion limit: ``json.loads`` raises RecursionError, not the
      JSONDecodeError openenv-core answers as ``INVALID_JSON``, and the session ended, its env and episode
      lost. Such a message is passed on as invalid JSON.
    - A lone surrogate escape (``"\\ud800"``): pydantic refuses the string, openenv-core's error reply quoting it
      could not be encoded as UTF-8, and the session ended. Such strings are passed on with U+FFFD in its place.

    Only a message with many brackets, or with a ``\\ud`` escape, is parsed for the guard (otherwise two
    ``str.count`` and two ``in`` checks per message). ``action_cls`` None turns the fast path off."""

    WORTH_CHECKING = 256  # opening brackets; Python's JSON parser fails somewhere near 1,000 levels

    def __init__(self, app: Any, action_cls: type | None = None) -> None:
        self.app, self.action_cls = app, action_cls
        self.answered = 0  # messages answered here, all connections (tests read it: the fast path did engage)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        from starlette.websockets import WebSocketDisconnect

        fast = self.action_cls is not None and scope["path"] == "/ws" and not scope.get("root_path")
        connection = _Connection()
        token = _CONNECTION.set(connection if fast else None)

        async def checked() -> Any:
            while True:
                message = await receive()
                text = message.get("text")
                if text is None:
                    return message
                guarded = self.guard(text)
                reply = await self.answer(connection.env, guarded) if connection.env is not None else None
                if reply is None:
                    return message if guarded is text else {**message, "text": guarded}
                try:
                    await send({"type": "websocket.send", "text": reply})
                except OSError:  # the client has gone (uvicorn's ClientDisconnected): the handler ends the session
                    return {"type": "websocket.disconnect", "code": 1006}
                self.answered += 1

        try:
            with contextlib.suppress(WebSocketDisconnect):
                await self.app(scope, checked, send)
        finally:
            _CONNECTION.reset(token)

    def guard(self, text: str) -> str:
        deep = text.count("[") + text.count("{") > self.WORTH_CHECKING
        if not deep and "\\ud" not in text and "\\uD" not in text:
            return text
        try:
            data = json.loads(text)
        except RecursionError:
            return "nested too deeply"  # invalid JSON: openenv-core answers INVALID_JSON
        except ValueError:
            return text  # openenv-core's own INVALID_JSON
        safe = strict_json(data, finite=False)  # a NaN stays, for openenv-core to refuse
        return text if safe == data else json.dumps(safe)

    async def answer(self, env: Any, text: str) -> str | None:
        """The reply openenv-core's handler would send to a reset or step message, or None to leave the
        message to it: anything else, or a message its models refuse (before the env is called)."""
        try:
            message = json.loads(text)
            kind = message.get("type") if isinstance(message, dict) else None
            if kind == "reset":  # the handler passes every field: the env's reset_async takes **kwargs
                call = env.reset_wire(**WSResetMessage(**message).data)
            elif kind == "step":
                call = env.step_wire(deserialize_action(WSStepMessage(**message).data, self.action_cls))
            else:
                return None
        except Exception:  # whatever it is, openenv-core's handler decides the reply
            return None
        try:  # from here on, the handler's own try: the same replies to the same outcomes
            # WSObservationResponse(data=serialize_observation(...)).model_dump_json(), written directly
            return to_json({"type": "observation", "data": await call}, inf_nan_mode="null").decode()
        except ValidationError as error:
            data = {"message": "Invalid message", "code": WSErrorCode.VALIDATION_ERROR, "errors": error.errors()}
            return WSErrorResponse(data=data).model_dump_json()
        except Exception as error:
            return WSErrorResponse(data={"message": str(error), "code": WSErrorCode.EXECUTION_ERROR}).model_dump_json()
