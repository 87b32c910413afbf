"""JSON POSTs to OpenAI-compatible servers with timeouts, retries and errors that say what went wrong.

Retried: timeouts, connection failures, HTTP 408/409/429 and 5xx, and malformed bodies (not JSON, JSON
nested too deeply, a body that does not decode, one over ``max_response_bytes``, or JSON without the fields
the caller needs or with one of the wrong type, which the error names). Not retried: other 4xx (a bad
request stays bad) and redirects (not followed: a POST would not survive one; the error names where it points).
Every attempt sends the same body: a request with a ``seed`` draws the same way again (as far as the server
repeats itself), one without draws a fresh sample (docs/vllm.md#seeded-draws).
``timeout_s`` bounds each attempt as a whole, so a server that trickles its body never holds a request longer.
``max_response_bytes`` bounds what a body may take in memory: it is read and decoded as it arrives, and refused
once it passes the limit (or its Content-Length says it will), so an endless body or a gzip bomb is one error,
not a process killed for memory. Like other malformed bodies it is retried: it costs at most the limit per try.
After the last attempt a ``BackendError`` names the URL, the attempts and the last failure; a prompt longer
than the model's context window is a ``ContextLengthExceeded`` (a ``BackendError``), so callers can tell it
from a failure. ``rl_llm.urls.check_server_url`` refuses a URL that no request could be sent to, when the client is made.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn, TypeVar

import httpx

from rl_llm.checks import integer, seconds
from rl_llm.errors import RLLMError
from rl_llm.urls import check_server_url, shown_url

T = TypeVar("T")
RETRYABLE_STATUS = frozenset({408, 409, 429})
MAX_RETRY_AFTER_S = 30.0
#: The default ``max_response_bytes``: far above any real reply (the log-probs of a long generation are a few
#: MB), far below what would run a machine out of memory.
MAX_RESPONSE_BYTES = 64 * 2**20
#: The content codings asked for: the ones decoded here in bounded pieces (httpx asks for br and zstd too when
#: their packages are installed, and inflates each chunk of those, as of gzip, whole).
ACCEPT_ENCODING = "gzip, deflate"
#: Known codings that were not asked for, refused by name (others are passed through undecoded, as httpx does).
_UNASKED_CODINGS = frozenset({"br", "zstd", "compress", "x-compress"})
#: Stacked codings undone at most: no server stacks them, and each is a decompressor held per request.
_MAX_CODINGS = 3
#: The most one decompression step yields, so one network chunk of a bomb never inflates at once.
_PIECE_BYTES = 64 * 2**10


class BackendError(RLLMError, RuntimeError):
    """A generation request failed for good (after retries, or on a non-retryable error)."""


class ContextLengthExceeded(BackendError):
    """The server refused the request because the prompt no longer fits the model's context window."""


#: How servers say so: vLLM ("maximum context length"), OpenAI (code "context_length_exceeded").
CONTEXT_LENGTH_MARKERS = ("maximum context length", "context_length_exceeded")


class MalformedResponse(ValueError):
    """The server answered, but not with what the API promises."""


class ResponseTooLarge(MalformedResponse):
    """The body is larger than ``max_response_bytes`` (decoded), or its Content-Length says it is."""


def client_options(*, timeout_s: Any = 60.0, max_retries: Any = 3, backoff_s: Any = 0.5, max_concurrency: Any = 64,
                   max_response_bytes: Any = MAX_RESPONSE_BYTES) -> dict[str, Any]:  # fmt: skip
    """``RetryingJSONClient``'s limits, checked (one ValueError naming the bad one) and as Python numbers.

    Checked when the client is made: a NaN, zero or negative timeout made every attempt time out, 1e30
    overflowed the socket's timeout on the first request, a float retry count failed in ``range``, a
    concurrency of 0 made a semaphore no request ever passed."""
    return {
        "timeout_s": seconds("timeout_s", timeout_s),
        "max_retries": integer("max_retries", max_retries),
        "backoff_s": seconds("backoff_s", backoff_s, allow_zero=True),
        "max_concurrency": integer("max_concurrency", max_concurrency, minimum=1),
        "max_response_bytes": integer("max_response_bytes", max_response_bytes, minimum=1),
    }


class RetryingJSONClient:
    """POSTs JSON to ``base_url`` (see the module docstring). ``max_response_bytes``: the most a reply body may
    be, decoded; past it the reply is refused, so a misbehaving server cannot run the process out of memory."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str] | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_concurrency: int = 64,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        options = client_options(timeout_s=timeout_s, max_retries=max_retries, backoff_s=backoff_s,
                                 max_concurrency=max_concurrency, max_response_bytes=max_response_bytes)  # fmt: skip
        self.base_url = check_server_url("base_url", base_url).rstrip("/")
        self.headers = dict(headers or {})
        self.timeout_s = options["timeout_s"]
        self.max_retries = options["max_retries"]
        self.backoff_s = options["backoff_s"]
        self.max_concurrency = options["max_concurrency"]
        self.max_response_bytes = options["max_response_bytes"]
        # httpx clients and semaphores belong to the event loop they are used on.
        self._clients: dict[asyncio.AbstractEventLoop, tuple[httpx.AsyncClient, asyncio.Semaphore]] = {}

    def _client(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            headers = {"Accept-Encoding": ACCEPT_ENCODING, **self.headers}
            client = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=self.timeout_s)
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
                    response = await asyncio.wait_for(self._send(client, path, body), self.timeout_s)
                except (httpx.TimeoutException, asyncio.TimeoutError):
                    failure = f"no response within {self.timeout_s:g}s (timeout)"
                except httpx.DecodingError as error:  # e.g. Content-Encoding: gzip on a body that is not
                    failure = f"malformed response (the body does not decode: {error})"
                except ResponseTooLarge as error:
                    failure = f"malformed response ({error})"
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
                        except RecursionError:  # JSON nested past the parser's limit: raised out of here before
                            failure = f"malformed response (JSON nested too deeply); body: {_snippet(response.text)}"
            if attempt < self.max_retries:
                await asyncio.sleep(max(delay, self.backoff_s * 2**attempt))
        raise BackendError(f"POST {url} failed after {self.max_retries + 1} attempt(s): {failure}")

    async def _send(self, client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> httpx.Response:
        """One attempt: the response with its body, read as it arrives and refused past ``max_response_bytes``
        (leaving the ``async with`` early closes the connection, and the rest of the body is never read)."""
        async with client.stream("POST", path, json=body) as response:
            reader = BodyReader(response, self.max_response_bytes)
            async for chunk in response.aiter_raw():
                reader.feed(chunk)
            return reader.response()

    async def aclose(self) -> None:
        clients, self._clients = self._clients, {}
        for client, _ in clients.values():
            await client.aclose()


def get_capped(url: str, *, timeout_s: float, max_response_bytes: int = MAX_RESPONSE_BYTES) -> httpx.Response:
    """GET ``url`` once, its body capped as in ``RetryingJSONClient`` (``ResponseTooLarge`` past it)."""
    headers = {"Accept-Encoding": ACCEPT_ENCODING}
    with httpx.stream("GET", url, timeout=timeout_s, headers=headers) as response:
        reader = BodyReader(response, max_response_bytes)
        for chunk in response.iter_raw():
            reader.feed(chunk)
        return reader.response()


class BodyReader:
    """A streamed response's body, fed raw chunks as they arrive and decoded in bounded pieces; past ``limit``
    bytes (raw or decoded) it raises ``ResponseTooLarge`` at once, so a body never holds more than about
    ``limit`` bytes of memory, however long it is or however far it inflates."""

    def __init__(self, response: httpx.Response, limit: int) -> None:
        self._head, self._limit = response, limit
        self._layers = _inflaters(response.headers)
        self._parts: list[bytes] = []
        self._raw = self._size = 0
        declared = response.headers.get("content-length", "").strip()
        if declared.isdigit() and int(declared) > limit:  # refused before a byte of it is read
            self._refuse(f" (its Content-Length is {declared})")

    def feed(self, chunk: bytes) -> None:
        # raw bytes count too: endless empty deflate blocks decode to nothing, but are still an endless body
        self._raw += len(chunk)
        if self._raw > self._limit:
            self._refuse()
        for piece in _decode(self._layers, chunk):
            self._size += len(piece)
            if self._size > self._limit:
                self._refuse(" (decoded)" if self._layers else "")
            self._parts.append(piece)

    def response(self) -> httpx.Response:
        """The response with the decoded body, for ``.text`` and ``.json()`` (its coding headers dropped)."""
        head = self._head
        headers = [(key, value) for key, value in head.headers.multi_items()
                   if key.lower() not in ("content-encoding", "content-length")]  # fmt: skip
        content = b"".join(self._parts)
        return httpx.Response(head.status_code, headers=headers, content=content, request=head.request)

    def _refuse(self, detail: str = "") -> NoReturn:
        limit = self._limit
        raise ResponseTooLarge(f"the body{detail} is larger than max_response_bytes={limit} ({_size(limit)}), "
                               f"the most this client reads of a reply; if replies this large are expected, "
                               f"raise the agent's max_response_bytes option")  # fmt: skip


class _Inflater:
    """Undoes one gzip or deflate coding, yielding at most ``_PIECE_BYTES`` at a time: a bomb's chunk of 64 KB
    inflates to 64 MB in one step (to 64 GB through a second coding), so the limit is checked in between."""

    def __init__(self, coding: str) -> None:
        gzip = coding in ("gzip", "x-gzip")
        self._zlib = zlib.decompressobj(zlib.MAX_WBITS | 16 if gzip else zlib.MAX_WBITS)
        # deflate is zlib-wrapped (RFC 9110) but some servers send it raw: tried second, as httpx does
        self._try_raw = not gzip

    def feed(self, data: bytes) -> Iterator[bytes]:
        while True:
            piece = self._inflate(data)
            if piece:
                yield piece
            data = self._zlib.unconsumed_tail
            if not data and len(piece) < _PIECE_BYTES:  # all input taken, and no output held back
                return

    def _inflate(self, data: bytes) -> bytes:
        try:
            piece = self._zlib.decompress(data, _PIECE_BYTES)
        except zlib.error as error:
            if not self._try_raw:
                raise httpx.DecodingError(str(error)) from None
            self._try_raw, self._zlib = False, zlib.decompressobj(-zlib.MAX_WBITS)
            return self._inflate(data)
        self._try_raw = False
        return piece


def _inflaters(headers: httpx.Headers) -> list[_Inflater]:
    """One ``_Inflater`` per coding in Content-Encoding, the last applied first."""
    codings = [value.strip().lower() for value in headers.get_list("content-encoding", split_commas=True)]
    unasked = [coding for coding in codings if coding in _UNASKED_CODINGS]
    if unasked:
        asked = f"Accept-Encoding: {ACCEPT_ENCODING}"
        raise httpx.DecodingError(f"Content-Encoding {unasked[0]!r} was not asked for ({asked})")
    codings = [coding for coding in codings if coding in ("gzip", "x-gzip", "deflate")]
    if len(codings) > _MAX_CODINGS:
        raise httpx.DecodingError(f"Content-Encoding stacks {len(codings)} codings, more than {_MAX_CODINGS}")
    return [_Inflater(coding) for coding in reversed(codings)]


def _decode(layers: Sequence[_Inflater], data: bytes) -> Iterator[bytes]:
    if not layers:
        yield data
        return
    for piece in layers[0].feed(data):
        yield from _decode(layers[1:], piece)


def _size(count: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count} bytes"




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
