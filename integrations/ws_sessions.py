"""The env server's WebSocket endpoint, ``/sessions/ws``: one connection holds one session for its episodes.

A client that keeps a connection per episode skips HTTP's per-request parsing and routing; the env calls, the
timeouts, the session limits and the reaper are the HTTP endpoints' own (docs/serving.md#websocket-sessions).
Messages are JSON text frames; every request gets exactly one reply, in order:

- ``{"op": "create", "env_id", "kwargs"?}`` or ``{"op": "attach", "session_id"}`` -> ``{"session_id"}``
- ``{"op": "reset", "seed"?, "options"?}`` -> the reply of ``POST /sessions/{id}/reset``
- ``{"op": "step", "action"}`` (or ``"messages"``) -> the reply of ``POST /sessions/{id}/step``
- ``{"op": "close"}`` -> ``{"session_id", "closed": true}``, then the server closes the connection

A refused request answers ``{"error": {"status", "detail"}}`` with the HTTP endpoints' status codes, and the
connection stays open. When the connection drops, a session it created is closed at once (one it attached
to is left to its owner, or the reaper).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

if TYPE_CHECKING:
    from rl_llm.integrations.http_server import EnvServer


async def serve_session(server: EnvServer, socket: WebSocket) -> None:
    from rl_llm.integrations.http_server import CreateRequest, ResetRequest, StepRequest

    await socket.accept()
    session_id: str | None = None
    owned = False
    try:
        while True:
            text = await socket.receive_text()
            try:
                message = json.loads(text)
                if not isinstance(message, dict):
                    raise HTTPException(422, "each message is a JSON object with an 'op'")
                op = message.pop("op", None)
                if op in ("create", "attach") and session_id is not None:
                    raise HTTPException(409, f"this connection already holds session {session_id!r}")
                if op == "create":
                    session_id = (await server.create(CreateRequest(**{**message, "count": 1})))[0]
                    owned = True
                    reply: dict[str, Any] = {"session_id": session_id}
                elif op == "attach":
                    session_id = server.session(str(message.get("session_id"))).id
                    reply = {"session_id": session_id}
                elif op in ("reset", "step", "close") and session_id is None:
                    raise HTTPException(409, "no session yet: send {'op': 'create', 'env_id': ...} first")
                elif op == "reset":
                    reply = await server.reset(session_id, ResetRequest(**message))
                elif op == "step":
                    reply = await server.step(session_id, StepRequest(**message))
                elif op == "close":
                    await server.close(session_id)
                    await socket.send_text(json.dumps({"session_id": session_id, "closed": True}))
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
            await socket.send_text(json.dumps(reply))
    except WebSocketDisconnect:
        pass
    finally:
        if owned and session_id is not None:
            server.forget(session_id)


def _short(error: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in error.errors())
