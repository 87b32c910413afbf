"""The env servers' hottest routes, answered ahead of FastAPI's routing.

For a cheap env, FastAPI's per-request machinery (routing, dependency solving, body validation through its
dependency system, response encoding) costs more than the env: on the 2-core machine it held the servers to
0.5x-0.85x of a bare FastAPI app that answers without any env (docs/serving.md#fast-routes). ``FastRoutes``
is ASGI middleware that answers the few routes every episode calls (reset and step) itself, and nothing else:

- it takes only a well-formed request: ``POST`` to a path one of its routes matches, a JSON object body that
  the route's own request models accept (``FastRoute.parse``, pydantic, the same models the FastAPI route
  declares);
- anything else (another route or method, another content type, a body that is not a JSON object or does
  not parse, one the models refuse, a ``root_path`` mount) goes on to the FastAPI app untouched, with the
  body it sent, so every validation error is FastAPI's own reply;
- an ``HTTPException`` from the handler is answered as FastAPI's handler answers it (``{"detail": ...}``,
  its status and headers); any other exception propagates as it would from the route (a 500).

Each server tests that both paths give the same replies to the same requests (tests/integrations/).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException
from fastapi.encoders import jsonable_encoder
from pydantic_core import PydanticSerializationError, to_json
from starlette.responses import JSONResponse

from rl_llm import checks

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass(frozen=True)
class FastRoute:
    """``POST`` to a path ``pattern`` matches in full: ``parse(body, match)`` turns the JSON object into the
    handler's arguments (raising, pydantic's ``ValidationError`` for one, or returning None leaves the request
    to FastAPI), ``answer(arguments)`` returns the reply's JSON bytes."""

    pattern: re.Pattern[str]
    parse: Callable[[dict[str, Any], re.Match[str]], Any]
    answer: Callable[[Any], Awaitable[bytes]]


class FastRoutes:
    """ASGI middleware: requests one of ``routes`` takes are answered here, the rest by ``app``."""

    def __init__(self, app: Any, routes: list[FastRoute]) -> None:
        self.app, self.routes = app, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self._route(scope)
        if found is None:
            await self.app(scope, receive, send)
            return
        route, match = found
        body = await read_body(receive)
        if body is None:  # the client left before sending its request
            return
        arguments = parse(route, match, body) if is_json(scope) else None
        if arguments is None:
            await self.app(scope, replay(body, receive), send)
            return
        try:
            reply = await route.answer(arguments)
        except HTTPException as error:  # as FastAPI's own handler answers it (and answer_validation_errors_safely)
            detail = strict_json(jsonable_encoder(error.detail))
            await JSONResponse({"detail": detail}, error.status_code, error.headers)(scope, receive, send)
            return
        # The success reply is sent by hand: a Response object costs a few microseconds on every call.
        headers = [(b"content-length", str(len(reply)).encode()), (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": reply})

    def _route(self, scope: Scope) -> tuple[FastRoute, re.Match[str]] | None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            return None
        for route in self.routes:
            match = route.pattern.fullmatch(scope["path"])
            if match is not None:
                return route, match
        return None


def parse(route: FastRoute, match: re.Match[str], body: bytes) -> Any:
    """The route's arguments, or None when FastAPI should answer: a body that is not a JSON object, one the
    route's models refuse, or one that fails to parse in any other way (JSON nested too deep for the parser
    is a RecursionError, which FastAPI answers with a 400)."""
    try:
        data = json.loads(body) if body else None
        return route.parse(data, match) if isinstance(data, dict) else None
    except Exception:  # whatever it is, FastAPI's own path decides the reply
        return None


TOO_LARGE = object()  # read_body's answer for a body past its limit


async def read_body(receive: Receive, limit: int | None = None) -> Any:
    """The whole body as bytes; None when the client left before sending it; ``TOO_LARGE`` as soon as it passes
    ``limit`` bytes (the rest is never read)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            return TOO_LARGE
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the already-read body to the next app, then listens on for a disconnect."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return again


#: The default request body cap of both env servers: far above any real request (a batch step of 256 sessions
#: with long turns is a few MB), far below what would run a server out of memory.
MAX_BODY_BYTES = 32 * 2**20


class BodyLimit:
    """ASGI middleware: an HTTP request body over ``max_bytes`` is answered 413 and never held whole.

    Why: the fast routes (and FastAPI, whose own ``max_body_size`` is off by default and absent before 0.165)
    read a body whole, so one client posting gigabytes grew the server's memory until it was killed, every
    session on it lost. A declared Content-Length over the cap is refused before a byte is read; a body without
    one is read until it passes the cap. The body read here goes on to the app as it came (``replay``).
    """

    def __init__(self, app: Any, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app, self.max_bytes = app, checks.integer("max_bytes", max_bytes, minimum=1)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        too_large = declared is not None and declared > self.max_bytes
        body = TOO_LARGE if too_large else await read_body(receive, self.max_bytes)
        if body is None:  # the client left before sending its request
            return
        if body is TOO_LARGE:
            detail = f"request body over {self.max_bytes} bytes, the most this server reads (--max-body-mb)"
            await JSONResponse({"detail": detail}, 413, {"Connection": "close"})(scope, receive, send)
            return
        await self.app(scope, replay(body, receive), send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.strip().isdigit() else None
    return None


def is_json(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


# -- 422 replies that strict JSON can carry ------------------------------------------------------------------
def answer_validation_errors_safely(app: Any) -> None:
    """FastAPI's 422 reply quotes the offending input (and openenv-core's action errors put pydantic's errors in
    an HTTPException's detail); when that input is NaN or an infinity (which Python's JSON parser accepts) or a
    string with a lone surrogate (``"\\ud800"``), the encoder raised and the client got a bare 500 with a
    traceback in the server's log. These handlers answer as FastAPI's own do, with those values replaced by
    what strict UTF-8 JSON can carry (null; U+FFFD)."""
    from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    async def validation_error(request: Any, error: RequestValidationError) -> Any:
        safe = RequestValidationError(strict_json(jsonable_encoder(error.errors())))
        return await request_validation_exception_handler(request, safe)

    async def http_error(request: Any, error: StarletteHTTPException) -> Any:
        safe = StarletteHTTPException(error.status_code, strict_json(jsonable_encoder(error.detail)), error.headers)
        return await http_exception_handler(request, safe)

    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)


def encode_strict(content: Any) -> bytes:
    """``content`` (already JSON-shaped) as strict UTF-8 JSON, NaN and infinities as null (pydantic-core's
    encoder, FastAPI's own). A lone surrogate (an env's error or observation quoting a client's ``"\\ud800"``,
    which a reset option can carry) is not UTF-8, and the encoder raised: on the WebSocket that dropped the
    connection and its session, over HTTP it was a bare 500 with a traceback. Only then is the content
    copied with U+FFFD in its place (``strict_json``), so a normal reply costs nothing more."""
    try:
        return to_json(content, inf_nan_mode="null")
    except PydanticSerializationError:
        return to_json(strict_json(content), inf_nan_mode="null")


def strict_json(value: Any, finite: bool = True) -> Any:
    """``value`` (already JSON-shaped) with lone surrogates (valid in a JSON escape, ``"\\ud800"``, but not in
    UTF-8) replaced by U+FFFD and, unless ``finite`` is False, NaN and infinities by None."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        return value
    if isinstance(value, float):
        return None if finite and not math.isfinite(value) else value
    if isinstance(value, dict):
        return {strict_json(key, finite): strict_json(item, finite) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(item, finite) for item in value]
    return value
