"""The env server's WebSocket endpoint, ``/sessions/ws``: one connection holds one session for its episodes.

A client that keeps a connection per episode skips HTTP's per-request parsing and routing; the env calls, the
timeouts, the session limits and the reaper are the HTTP endpoints' own, except that inline env calls of many
connections run back to back in one loop callback (``LoopBatch``, docs/serving.md#websocket-sessions).
Messages are JSON text frames; every request gets exactly one reply, in order:

- ``{"op": "create", "env_id", "kwargs"?}`` or ``{"op": "attach", "session_id"}`` -> ``{"session_id"}``
- ``{"op": "reset", "seed"?, "options"?}`` -> the reply of ``POST /sessions/{id}/reset``
- ``{"op": "step", "action"}`` (or ``"messages"``) -> the reply of ``POST /sessions/{id}/step``
- ``{"op": "close"}`` -> ``{"session_id", "closed": true}``, then the server closes the connection

A refused request answers ``{"error": {"status", "detail"}}`` with the HTTP endpoints' status codes, and the
connection stays open. Each message's fields are checked by the HTTP endpoints' own request models, so a field
of the wrong type (or missing, or unknown) is a 422 whose one-line detail names it, as over HTTP; ``count``
is refused (one session per connection). When the connection drops, a session it created is closed at once
(one it attached to is left to its owner, or the reaper).
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any, Literal

from fastapi import HTTPException, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from rl_llm.integrations.fast_routes import encode_strict

if TYPE_CHECKING:
    from rl_llm.integrations.http_server import EnvServer, StepRequest


async def serve_session(server: EnvServer, socket: WebSocket) -> None:
    from rl_llm.integrations.http_server import (
        AttachRequest,
        CloseRequest,
        CreateRequest,
        ResetRequest,
        StepRequest,
    )

    await socket.accept()
    receive, send = socket.receive, socket.send  # the ASGI messages themselves: see _encode for why
    session_id: str | None = None
    owned = False
    try:
        while True:
            frame = await receive()
            if frame["type"] == "websocket.disconnect":
                return
            try:
                text = frame.get("text")
                step = _step_message(text) if session_id is not None else None
                if step is not None:  # the common case, parsed and validated in one pass
                    op, message = "step", {}
                elif text is None:
                    raise HTTPException(422, "send each message as a JSON text frame, not a binary one")
                else:
                    message = json.loads(text)
                    if not isinstance(message, dict):
                        raise HTTPException(422, "each message is a JSON object with an 'op'")
                    op = message.pop("op", None)
                if op in ("create", "attach") and session_id is not None:
                    raise HTTPException(409, f"this connection already holds session {session_id!r}")
                if op == "step" and session_id is not None:
                    reply: dict[str, Any] = await server.step(session_id, step or StepRequest(**message), batched=True)
                elif op == "create":
                    if "count" in message:  # not silently one session of the count asked for
                        raise HTTPException(422, "count: a connection holds one session; open one per session")
                    session_id = (await server.create(CreateRequest(**message)))[0]
                    owned = True
                    reply = {"session_id": session_id}
                elif op == "attach":  # a missing or non-string id is a 422 naming it, not a 404 for "None"
                    session_id = server.session(AttachRequest(**message).session_id).id
                    reply = {"session_id": session_id}
                elif op in ("reset", "step", "close") and session_id is None:
                    raise HTTPException(409, "no session yet: send {'op': 'create', 'env_id': ...} first")
                elif op == "reset":
                    reply = await server.reset(session_id, ResetRequest(**message), batched=True)
                elif op == "close":
                    CloseRequest(**message)  # an unknown field is a 422, as in the other messages
                    await server.close(session_id)
                    await send({"type": "websocket.send", "text": _encode({"session_id": session_id, "closed": True})})
                    session_id = None
                    await socket.close()
                    return
                else:
                    raise HTTPException(422, f"unknown op {op!r}; use create, attach, reset, step or close")
            except HTTPException as error:
                reply = {"error": {"status": error.status_code, "detail": error.detail}}
            except ValidationError as error:
                reply = {"error": {"status": 422, "detail": _short(error)}}
            except ValueError as error:  # not JSON
                reply = {"error": {"status": 422, "detail": f"not a JSON message: {error}"}}
            except RecursionError:  # json.loads on nesting deeper than Python's recursion limit
                reply = {"error": {"status": 422, "detail": "not a JSON message: nested too deeply"}}
            await send({"type": "websocket.send", "text": _encode(reply)})
    except WebSocketDisconnect:
        pass
    finally:
        if owned and session_id is not None:
            server.forget(session_id)


def _step_message(text: str | None) -> StepRequest | None:
    """A step message parsed and validated by pydantic-core in one pass, or None: anything else (another op, a
    bad step) takes the general path, which answers errors as before. Half the time of ``json.loads`` and a
    model built from the dict, on the message that is most of a session's traffic."""
    if text is None or '"step"' not in text:
        return None
    try:
        return _step_model().model_validate_json(text)
    except ValidationError:
        return None


@functools.cache
def _step_model() -> type[StepRequest]:
    from rl_llm.integrations.http_server import StepRequest  # here: http_server imports this module

    class StepMessage(StepRequest):
        op: Literal["step"]

    return StepMessage


def _encode(reply: dict[str, Any]) -> str:
    """The reply as strict JSON, the HTTP endpoints' encoder (``encode_strict``: pydantic-core, NaN and infinity
    as null, a lone surrogate as U+FFFD, which raised out of the session loop before). A cheap
    env's step is a few tens of microseconds, so per-message overhead is most of the endpoint's cost: this is
    about a quarter of ``json.dumps``'s time on a step reply, and the messages go to ``socket.send`` as they
    are, skipping ``send_text``/``receive_text``'s extra layer (docs/serving.md#websocket-sessions)."""
    return encode_strict(reply).decode()


def _short(error: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in error.errors())
