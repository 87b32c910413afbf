"""Real HTTP servers on 127.0.0.1 for the backend tests (standard library ``http.server`` in a thread).

``ChatStub`` answers OpenAI chat completions like a hosted model would: it plays tic-tac-toe by taking the
first legal move from the last user message, leaves the stop string out of its text (as the API does), and
can be scripted to misbehave first: ``"timeout"`` (answer late), ``"500"``, ``"400"``, ``"not-json"``,
``"no-choices"``.

``CompletionsStub`` serves vLLM's ``/v1/completions`` for token prompts with ``return_tokens_as_token_ids``,
generating with a real ``HFPolicy``, so the vLLM server client can be tested without vLLM.

``RawStub`` answers every request (GET or POST) with whatever its ``reply(handler, method, path)`` writes to
``handler.wfile``: bodies that do not decode, trickled bodies, redirects, fields of the wrong type.
``EndlessBody`` is such a reply: a body that never ends, counting what it sent.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rl_llm.agents.llm import GenerationRequest
from rl_llm.envs.retrieval.server import send_json


class _Server:
    def __init__(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                status, payload, delay = outer.respond(self.path, body)
                time.sleep(delay)
                # a client that gave up waiting (a timeout test) is not an error here either
                send_json(self, status, payload if isinstance(payload, bytes) else json.dumps(payload).encode())

            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                pass

        self._listen(Handler)

    def _listen(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.lock = threading.Lock()
        self.requests: list[Any] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def respond(self, path: str, body: dict[str, Any]) -> tuple[int, Any, float]:
        raise NotImplementedError

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class ChatStub(_Server):
    def __init__(self, failures: list[str] | None = None, slow_s: float = 1.0) -> None:
        self.failures: deque[str] = deque(failures or [])
        self.slow_s = slow_s
        super().__init__()

    def respond(self, path: str, body: dict[str, Any]) -> tuple[int, Any, float]:
        with self.lock:
            failure = self.failures.popleft() if self.failures else None
        if failure == "timeout":
            return 200, self._reply(body), self.slow_s
        if failure in ("500", "400"):
            return int(failure), {"error": {"message": f"scripted {failure}"}}, 0.0
        if failure == "not-json":
            return 200, b"<html>502 Bad Gateway</html>", 0.0
        if failure == "no-choices":
            return 200, {"id": "x", "object": "chat.completion"}, 0.0
        return 200, self._reply(body), 0.0

    @staticmethod
    def _reply(body: dict[str, Any]) -> dict[str, Any]:
        last = body["messages"][-1]["content"]
        legal = next((line for line in last.splitlines() if line.startswith("Legal moves:")), "Legal moves: B2")
        move = legal.split(":", 1)[1].split(",")[0].strip()
        text = f"I take {move}. <move>{move}"  # the API drops the matched stop string "</move>"
        return {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        }


class CompletionsStub(_Server):
    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.generate_lock = threading.Lock()
        super().__init__()

    def respond(self, path: str, body: dict[str, Any]) -> tuple[int, Any, float]:
        if path != "/v1/completions" or not body.get("return_tokens_as_token_ids"):
            return 400, {"error": "this stub serves token prompts on /v1/completions only"}, 0.0
        request = GenerationRequest(messages=[], prompt_ids=list(body["prompt"]), stop=tuple(body.get("stop") or ()),
                                    max_new_tokens=body["max_tokens"])  # fmt: skip
        with self.generate_lock:
            (completion,) = self.policy.generate([request])
        choice = {
            "index": 0,
            "text": completion.text,
            "finish_reason": completion.finish_reason,
            "logprobs": {
                "tokens": [f"token_id:{token}" for token in completion.token_ids],
                "token_logprobs": completion.logprobs,
            },
        }
        return 200, {"id": "cmpl-stub", "object": "text_completion", "choices": [choice]}, 0.0


def write_response(handler: BaseHTTPRequestHandler, status: int, body: bytes | dict[str, Any],
                   headers: dict[str, str] | None = None) -> None:  # fmt: skip
    """A whole response with ``Content-Length`` (a dict body as JSON), through ``handler.wfile`` as it is."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    head = {"Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})}
    lines = [f"HTTP/1.1 {status} Scripted"] + [f"{key}: {value}" for key, value in head.items()]
    handler.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode() + data)


class RawStub(_Server):
    def __init__(self, reply: Callable[[BaseHTTPRequestHandler, str, str], None]) -> None:
        outer = self
        self.bodies: list[bytes] = []  # each request's body, as sent

        class Handler(BaseHTTPRequestHandler):
            def handle_one_request(self) -> None:  # one request per connection: a reply may leave it in any state
                self.close_connection = True
                super().handle_one_request()

            def _reply(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0))) if self.command == "POST" else b""
                with outer.lock:
                    outer.requests.append((self.command, self.path))
                    outer.bodies.append(body)
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
                    reply(self, self.command, self.path)

            do_GET = do_POST = _reply

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._listen(Handler)


class EndlessBody:
    """A ``RawStub`` reply: 200 with a body of spaces and no Content-Length, written until the client hangs up
    (or ``most`` bytes went, so a client that never does fails rather than hangs). ``sent``: the body bytes
    each connection was sent. The send buffer is kept small, so that sent is close to what the client read."""

    #: no Content-Length: the body ends when the connection does
    HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n"

    def __init__(self, most: int, chunk_bytes: int = 16 * 1024) -> None:
        self.most, self.chunk = most, b" " * chunk_bytes
        self.sent: list[int] = []
        self._ended = threading.Semaphore(0)

    def __call__(self, handler: BaseHTTPRequestHandler, method: str, path: str) -> None:
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, len(self.chunk))
        connection = len(self.sent)
        self.sent.append(0)
        try:
            handler.wfile.write(self.HEAD)
            while self.sent[connection] < self.most:
                handler.wfile.write(self.chunk)
                self.sent[connection] += len(self.chunk)
        finally:
            self._ended.release()

    def ended(self, connections: int, timeout_s: float = 10.0) -> list[int]:
        """``sent`` once ``connections`` replies have ended (the client hung up, or ``most`` bytes went)."""
        for _ in range(connections):
            if not self._ended.acquire(timeout=timeout_s):
                raise TimeoutError(f"a reply was still being written after {timeout_s:g}s")
        return self.sent
