"""JSON POSTs to OpenAI-compatible servers with timeouts, retries and errors that say what went wrong.

Retried: timeouts, connection failures, HTTP 408/409/429 and 5xx, and malformed bodies (not JSON, a body
that does not decode, or JSON without the fields the caller needs). Not retried: other 4xx (a bad request
stays bad) and redirects (not followed: a POST would not survive one; the error names where it points).
``timeout_s`` bounds each attempt as a whole, so a server that trickles its body never holds a request longer.
After the last attempt a ``BackendError`` names the URL, the attempts and the last failure; a prompt longer
than the model's context window is a ``ContextLengthExceeded`` (a ``BackendError``), so callers can tell it
from a failure. ``check_base_url`` refuses a URL that no request could be sent to, when the client is made.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from rl_llm.errors import RLLMError

T = TypeVar("T")
RETRYABLE_STATUS = frozenset({408, 409, 429})
MAX_RETRY_AFTER_S = 30.0


class BackendError(RLLMError, RuntimeError):
    """A generation request failed for good (after retries, or on a non-retryable error)."""


class ContextLengthExceeded(BackendError):
    """The server refused the request because the prompt no longer fits the model's context window."""


#: How servers say so: vLLM ("maximum context length"), OpenAI (code "context_length_exceeded").
CONTEXT_LENGTH_MARKERS = ("maximum context length", "context_length_exceeded")


class MalformedResponse(ValueError):
    """The server answered, but not with what the API promises."""


class RetryingJSONClient:
    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str] | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_concurrency: int = 64,
    ) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.base_url = check_base_url(base_url).rstrip("/")
        self.headers = dict(headers or {})
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_concurrency = max_concurrency
        # httpx clients and semaphores belong to the event loop they are used on.
        self._clients: dict[asyncio.AbstractEventLoop, tuple[httpx.AsyncClient, asyncio.Semaphore]] = {}

    def _client(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            client = httpx.AsyncClient(base_url=self.base_url, headers=self.headers, timeout=self.timeout_s)
            self._clients[loop] = (client, asyncio.Semaphore(self.max_concurrency))
        return self._clients[loop]

    async def post(self, path: str, body: dict[str, Any], parse: Callable[[Any], T]) -> T:
        """POST ``body`` and return ``parse(json)``; ``parse`` raises ``MalformedResponse`` on a bad body."""
        client, limit = self._client()
        url = f"{shown_url(self.base_url)}{path}"  # for messages: they reach logs and trajectory records
        failure = ""
        for attempt in range(self.max_retries + 1):
            delay = 0.0
            async with limit:
                try:
                    # httpx's timeout is per network operation: a body trickled a byte at a time would never
                    # trip it, so the whole attempt gets the deadline too.
                    response = await asyncio.wait_for(client.post(path, json=body), self.timeout_s)
                except (httpx.TimeoutException, asyncio.TimeoutError):
                    failure = f"no response within {self.timeout_s:g}s (timeout)"
                except httpx.DecodingError as error:  # e.g. Content-Encoding: gzip on a body that is not
                    failure = f"malformed response (the body does not decode: {error})"
                except httpx.RequestError as error:
                    failure = f"connection failed ({type(error).__name__}: {error})"
                else:
                    status = response.status_code
                    if 300 <= status < 400:
                        where = response.headers.get("location", "nowhere")
                        raise BackendError(f"POST {url} was redirected (HTTP {status}) to {where}; redirects are "
                                           f"not followed: use the URL it points to")  # fmt: skip
                    if status >= 400:
                        failure = f"HTTP {status}: {_snippet(response.text)}"
                        if status not in RETRYABLE_STATUS and status < 500:
                            if status == 400 and any(marker in response.text for marker in CONTEXT_LENGTH_MARKERS):
                                raise ContextLengthExceeded(f"POST {url}: the prompt no longer fits the model's "
                                                            f"context window: {failure}")  # fmt: skip
                            raise BackendError(f"POST {url} failed: {failure}")
                        delay = _retry_after(response)
                    else:
                        try:
                            return parse(response.json())
                        except (ValueError, KeyError, TypeError, IndexError) as error:
                            failure = f"malformed response ({error}); body: {_snippet(response.text)}"
            if attempt < self.max_retries:
                await asyncio.sleep(max(delay, self.backoff_s * 2**attempt))
        raise BackendError(f"POST {url} failed after {self.max_retries + 1} attempt(s): {failure}")

    async def aclose(self) -> None:
        clients, self._clients = self._clients, {}
        for client, _ in clients.values():
            await client.aclose()


def check_base_url(base_url: str) -> str:
    """``base_url`` when requests can be sent to it; else a ``ValueError`` saying why (httpx would only fail at
    the first request, deep inside its transport: an invalid port, no host, a query the path would follow)."""
    try:
        url = httpx.URL(base_url)
    except httpx.InvalidURL as error:
        raise ValueError(f"invalid server URL {base_url!r}: {error}") from None
    if url.scheme not in ("http", "https"):
        raise ValueError(f"the server URL must start with http:// or https://, got {base_url!r}")
    if not url.host:
        raise ValueError(f"the server URL {base_url!r} has no host")
    if url.port is not None and not 0 < url.port < 65536:
        raise ValueError(f"the server URL {base_url!r} has port {url.port}, outside 1-65535")
    if url.query or url.fragment:
        raise ValueError(f"the server URL {base_url!r} has a query or fragment; request paths are appended to it")
    return base_url


def shown_url(base_url: str) -> str:
    """``base_url`` as names and messages show it: credentials in it (``https://user:key@host/v1``, or a token
    as the user name) as ``***``. A policy's name goes into every trajectory record, bench result and log line."""
    try:
        url = httpx.URL(base_url)
    except httpx.InvalidURL:
        return base_url
    return str(url.copy_with(username="***", password=None)) if url.userinfo else base_url


def _snippet(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _retry_after(response: httpx.Response) -> float:
    try:
        return min(float(response.headers.get("retry-after", 0)), MAX_RETRY_AFTER_S)
    except ValueError:
        return 0.0


def require(condition: bool, message: str) -> None:
    if not condition:
        raise MalformedResponse(message)
