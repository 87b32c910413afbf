"""A small Python client for the rl-llm env server (``http_server.py``).

``EnvClient(url).make(env_id, **kwargs)`` returns a :class:`RemoteEnv` with the Gymnasium ``reset``/``step``/
``close`` API, so code written for local envs (the rollout engine, ``evaluate``) runs against remote ones.
``step_batch``/``reset_batch`` move many sessions in one request; a failed item comes back as an
:class:`EnvServerError` in its slot, the others still succeed. A server that is down or was killed mid-call
raises :class:`EnvServerUnavailable` naming the sessions whose episodes that may cost; once it is back, an old
session id gets a 404 saying the server restarted (docs/serving.md#faults).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import gymnasium as gym
import httpx

from rl_llm import checks
from rl_llm.envs.base import MAX_TEXT_LENGTH
from rl_llm.envs.spaces import UnicodeText
from rl_llm.errors import RLLMError
from rl_llm.urls import check_server_url, shown_url

StepResult = tuple[str, float, bool, bool, dict[str, Any]]
MAX_RETRY_AFTER_S = 10.0


class EnvServerError(RLLMError, RuntimeError):
    """The server refused or failed a request; ``status`` is the HTTP status, ``detail`` its explanation."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(f"env server error {status}: {detail}")
        self.status = status
        self.detail = detail


class EnvServerUnavailable(EnvServerError):
    """The server could not be reached, or dropped the connection mid-request (killed, restarting, down)."""

    def __init__(self, url: str, what: str, session_ids: Sequence[str], error: Exception) -> None:
        lost = f"; if it restarted, session(s) {', '.join(session_ids)} and their episodes are lost" if session_ids else ""
        RLLMError.__init__(self, f"env server at {url} unreachable during {what} ({type(error).__name__}: {error}){lost}")
        self.status = 503
        self.detail = str(self)
        self.session_ids = list(session_ids)


class EnvClient:
    """Synchronous client; thread-safe (one ``httpx.Client`` connection pool shared by all sessions)."""

    def __init__(self, base_url: str, timeout: float = 120.0, transport: httpx.BaseTransport | None = None,
                 busy_retries: int = 3) -> None:  # fmt: skip
        # Checked here, not at the first request: a NaN or infinite timeout failed there as a bare ValueError or
        # OverflowError, busy_retries=-1 as UnboundLocalError, and a URL without http:// as "unreachable".
        url = check_server_url("base_url", base_url)
        self._http = httpx.Client(base_url=url, timeout=checks.seconds("timeout", timeout), transport=transport)
        self.busy_retries = checks.integer("busy_retries", busy_retries)

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None, sessions: Sequence[str] = ()) -> Any:
        for attempt in range(self.busy_retries + 1):
            try:
                response = self._http.request(method, path, json=body)
            except httpx.TransportError as error:  # refused, reset, timed out: a clear error, never a hang
                raise EnvServerUnavailable(shown_url(str(self._http.base_url)), f"{method} {path}", sessions, error) from None
            # 503 with Retry-After: the server's env-call queue is full and nothing ran; wait as it asks, a
            # bounded number of times (docs/serving.md#limits-and-back-pressure). 429 (max_sessions) is not
            # retried: sessions free up only when some client closes them.
            if response.status_code != 503 or "retry-after" not in response.headers or attempt == self.busy_retries:
                break
            time.sleep(min(MAX_RETRY_AFTER_S, _seconds(response.headers["retry-after"])))
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise EnvServerError(response.status_code, detail)
        try:
            return response.json()
        except ValueError:  # not an env server there (a web page, a proxy's reply)
            raise EnvServerError(response.status_code, f"{method} {path} answered non-JSON {response.text[:200]!r}; "
                                 f"is {shown_url(str(self._http.base_url))} an rl-llm env server?") from None  # fmt: skip

    # -- sessions ---------------------------------------------------------------------------------------------
    def create(self, env_id: str, count: int = 1, **kwargs: Any) -> list[str]:
        return self._request("POST", "/sessions", {"env_id": env_id, "kwargs": kwargs, "count": count})["session_ids"]

    def make(self, env_id: str, **kwargs: Any) -> RemoteEnv:
        return RemoteEnv(self, self.create(env_id, **kwargs)[0])

    def reset(self, session_id: str, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        result = self._request("POST", f"/sessions/{_segment(session_id)}/reset", {"seed": seed, "options": options}, [session_id])
        return result["observation"], result["info"]

    def step(self, session_id: str, action: str) -> StepResult:
        return _step_tuple(self._request("POST", f"/sessions/{_segment(session_id)}/step", {"action": action}, [session_id]))

    def close_session(self, session_id: str) -> None:
        self._request("DELETE", f"/sessions/{_segment(session_id)}", sessions=[session_id])

    # -- batches ----------------------------------------------------------------------------------------------
    def reset_batch(
        self, session_ids: Sequence[str], seeds: Sequence[int | None], options: Sequence[dict[str, Any] | None] | None = None
    ) -> list[tuple[str, dict[str, Any]] | EnvServerError]:
        options = options if options is not None else [None] * len(session_ids)
        _same_length(session_ids, seeds=seeds, options=options)
        items = [{"session_id": s, "seed": seed, "options": o} for s, seed, o in zip(session_ids, seeds, options, strict=True)]
        results = self._request("POST", "/batch/reset", {"items": items}, session_ids)["results"]
        return [_item_error(r) or (r["observation"], r["info"]) for r in results]

    def step_batch(self, session_ids: Sequence[str], actions: Sequence[str]) -> list[StepResult | EnvServerError]:
        _same_length(session_ids, actions=actions)
        items = [{"session_id": s, "action": a} for s, a in zip(session_ids, actions, strict=True)]
        results = self._request("POST", "/batch/step", {"items": items}, session_ids)["results"]
        return [_item_error(r) or _step_tuple(r) for r in results]

    # -- server -----------------------------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        return self._request("GET", "/stats")

    def env_ids(self) -> list[str]:
        return self._request("GET", "/envs")["env_ids"]

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EnvClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _segment(session_id: Any) -> str:
    """``session_id`` as one path segment: a "/" or "?" in it reached another endpoint or a non-JSON reply."""
    if not isinstance(session_id, str) or not session_id:
        raise ValueError(f"session_id must be a non-empty string, got {session_id!r}")
    return quote(session_id, safe="")


def _same_length(session_ids: Sequence[str], **columns: Sequence[Any]) -> None:
    for name, column in columns.items():
        if len(column) != len(session_ids):
            raise ValueError(f"{name} has {len(column)} items for {len(session_ids)} session_ids; give one each")


def _seconds(retry_after: str) -> float:
    try:
        return max(0.0, float(retry_after))
    except ValueError:  # an HTTP date: not sent by this server
        return 1.0


def _step_tuple(result: dict[str, Any]) -> StepResult:
    return result["observation"], result["reward"], result["terminated"], result["truncated"], result["info"]


def _item_error(result: dict[str, Any]) -> EnvServerError | None:
    error = result.get("error")
    return EnvServerError(error["status"], error["detail"]) if error else None


class RemoteEnv(gym.Env[str, str]):
    """A server session behind the Gymnasium API. ``close()`` ends the session on the server."""

    def __init__(self, client: EnvClient, session_id: str) -> None:
        self.client = client
        self.session_id = session_id
        self.observation_space = UnicodeText(MAX_TEXT_LENGTH)
        self.action_space = UnicodeText(MAX_TEXT_LENGTH)
        self._closed = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        return self.client.reset(self.session_id, seed=seed, options=options)

    def step(self, action: str) -> StepResult:
        return self.client.step(self.session_id, action)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self.client.close_session(self.session_id)
            except EnvServerUnavailable:
                pass  # the server is gone, and its sessions with it (or its reaper frees this one)
            except EnvServerError as error:
                if error.status != 404:  # already reaped or timed out: nothing left to close
                    raise
