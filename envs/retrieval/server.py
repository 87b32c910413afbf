"""A retriever HTTP server on localhost, so many environments and processes share one index (as in
Search-R1). Standard library only: ``ThreadingHTTPServer`` plus a micro-batcher.

Requests from concurrent clients are queued; one worker thread takes everything waiting (up to
``max_batch`` queries, lingering at most ``max_wait_s`` for more) and answers it with a single
``search_batch`` call. Protocol (Search-R1 compatible)::

    POST /retrieve {"queries": ["..."], "topk": 3, "return_scores": true}
      -> {"result": [[{"document": {"id", "title", "text", "contents"}, "score": 1.2}, ...], ...]}
    GET /health -> {"status": "ok", "passages": N, "requests": R, "batches": B}

Run it: ``python -m rl_llm.envs.retrieval.server --corpus corpus.jsonl --port 8000`` (or ``--bundled``).
"""

from __future__ import annotations

import json
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rl_llm import checks
from rl_llm.console import (
    ArgumentParser,
    checked_host,
    checked_port,
    count_flag,
    host_flag,
    port_flag,
    seconds_flag,
)
from rl_llm.envs.retrieval.base import Hit, Retriever

MAX_BODY_BYTES = 8 << 20
MAX_TOPK = 100
SEARCH_TIMEOUT_S = 300.0


@dataclass
class _Request:
    queries: list[str]
    k: int
    future: Future = field(default_factory=Future)


class _Batcher:
    def __init__(self, retriever: Retriever, max_batch: int, max_wait_s: float) -> None:
        self.retriever, self.max_batch, self.max_wait_s = retriever, max_batch, max_wait_s
        self.pending: queue.Queue[_Request | None] = queue.Queue()
        self.requests = self.batches = 0
        self.thread = threading.Thread(target=self._run, name="retriever-batcher", daemon=True)
        self.thread.start()

    def submit(self, queries: list[str], k: int) -> list[list[Hit]]:
        request = _Request(queries, k)
        self.pending.put(request)
        return request.future.result(timeout=SEARCH_TIMEOUT_S)

    def _run(self) -> None:
        while (first := self.pending.get()) is not None:
            batch, size = [first], len(first.queries)
            try:
                while size < self.max_batch:
                    item = self.pending.get(timeout=self.max_wait_s)
                    if item is None:
                        self.pending.put(None)  # let the outer loop see the stop signal
                        break
                    batch.append(item)
                    size += len(item.queries)
            except queue.Empty:
                pass
            self._answer(batch)

    def _answer(self, batch: list[_Request]) -> None:
        queries = [query for request in batch for query in request.queries]
        try:
            hits = self.retriever.search_batch(queries, max(request.k for request in batch)) if queries else []
        except Exception as exc:  # the error goes back to the waiting client as HTTP 500
            if len(batch) > 1:
                # Each request alone, so that one client's query the index cannot take (say a lone surrogate
                # that a transformers tokenizer refuses) fails only that client, not the others it was
                # batched with.
                for request in batch:
                    self._answer([request])
                return
            batch[0].future.set_exception(exc)
            return
        self.requests += len(batch)
        self.batches += 1
        position = 0
        for request in batch:
            rows = hits[position : position + len(request.queries)]
            request.future.set_result([row[: request.k] for row in rows])
            position += len(request.queries)

    def stop(self) -> None:
        self.pending.put(None)
        self.thread.join(timeout=5)


def _document(hit: Hit) -> dict[str, Any]:
    p = hit.passage
    return {"document": {"id": p.id, "title": p.title, "text": p.text, "contents": f'"{p.title}"\n{p.text}'},
            "score": hit.score}  # fmt: skip


def send_json(handler: BaseHTTPRequestHandler, status: int, data: bytes) -> None:
    """Answer ``data`` (JSON bytes) with ``status``; a client that hung up before its answer is nobody to tell.
    Raised on, socketserver printed a traceback per such request (log spam from any client that gives up, e.g.
    on its own timeout)."""
    try:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
    except OSError:  # hung up (a broken pipe, a reset) or stopped reading (our socket timeout)
        handler.close_connection = True


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse connections
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms delayed-ACK stalls
    server: _Server

    def setup(self) -> None:
        # Every connection holds a thread: without a socket timeout one that goes quiet (a client that connects
        # and never sends, stops mid-body, or keeps an idle keep-alive open) held its thread for good, and
        # enough of them exhausted the process. Quiet past the timeout, the connection is closed.
        self.timeout = self.server.idle_timeout_s
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request is too much
        pass

    def _send(self, status: int, body: dict[str, Any]) -> None:
        send_json(self, status, json.dumps(body, ensure_ascii=False).encode("utf-8"))

    def do_GET(self) -> None:
        if self.path != "/health":
            self._send(404, {"error": f"unknown path {self.path}; use POST /retrieve or GET /health"})
            return
        batcher = self.server.batcher
        self._send(200, {"status": "ok", "passages": self.server.passages, "requests": batcher.requests,
                         "batches": batcher.batches})  # fmt: skip

    def do_POST(self) -> None:
        if self.path != "/retrieve":
            self._send(404, {"error": f"unknown path {self.path}; use POST /retrieve"})
            return
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            # Not read here: the chunks were parsed as the next request on the connection (a second, HTML reply).
            self.close_connection = True
            self._send(411, {"error": "send the body with a Content-Length, not chunked"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:  # a negative length would read until the client hangs up
            self.close_connection = True
            if length > MAX_BODY_BYTES:
                self._send(413, {"error": f"request body over {MAX_BODY_BYTES} bytes"})
            else:
                self._send(400, {"error": "Content-Length must be a non-negative integer"})
            return
        try:
            raw = self.rfile.read(length)
        except OSError:  # reset by the client: no request to answer (and no traceback for it)
            raw = b""
        if len(raw) < length:  # the client hung up mid-body: no request to answer
            self.close_connection = True
            return
        try:
            body = json.loads(raw or b"null")
            queries, k = self._validate(body)
        except (ValueError, UnicodeDecodeError) as exc:
            self._send(400, {"error": str(exc)})
            return
        except RecursionError:  # json.loads on nesting past Python's recursion limit
            self._send(400, {"error": "the body is JSON nested too deeply"})
            return
        try:
            rows = self.server.batcher.submit(queries, k)
        except Exception as exc:
            self._send(500, {"error": f"{type(exc).__name__}: {exc}"})
            return
        scored = body.get("return_scores", True)
        self._send(200, {"result": [[_document(h) if scored else _document(h)["document"] for h in row] for row in rows]})

    def _validate(self, body: Any) -> tuple[list[str], int]:
        if not isinstance(body, dict):
            raise ValueError('body must be a JSON object {"queries": [...], "topk": k}')
        queries, k = body.get("queries"), body.get("topk") or self.server.default_k
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            raise ValueError("'queries' must be a list of strings")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_TOPK:
            raise ValueError(f"'topk' must be an integer from 1 to {MAX_TOPK}")
        return queries, k


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default listen backlog is 5: a burst of clients connecting at once had SYNs dropped and
    # waited out 1 s retransmits (docs/serving.md#the-retriever-server).
    request_queue_size = 1024
    batcher: _Batcher
    default_k: int
    passages: int
    idle_timeout_s: float


class RetrieverServer:
    """``with RetrieverServer(retriever) as server: RetrieverClient(server.url)...``; ``port=0`` picks a free port."""

    def __init__(self, retriever: Retriever, *, host: str = "127.0.0.1", port: int = 0, default_k: int = 3,
                 max_batch: int = 256, max_wait_s: float = 0.002, idle_timeout_s: float = 60.0) -> None:  # fmt: skip
        # Checked before binding: a negative or NaN max_wait_s killed the batcher thread (every request then
        # waited SEARCH_TIMEOUT_S), default_k=0 refused every request without a topk, an infinite idle timeout
        # overflowed socket.settimeout per connection, and a port past 65535 was an OverflowError from bind().
        checked_host("host", host)
        checked_port("port", port)
        checks.integer("default_k", default_k, minimum=1, maximum=MAX_TOPK)
        checks.integer("max_batch", max_batch, minimum=1)
        max_wait_s = checks.seconds("max_wait_s", max_wait_s, allow_zero=True)
        idle_timeout_s = checks.seconds("idle_timeout_s", idle_timeout_s)
        self._server = _Server((host, port), _Handler)
        self._server.idle_timeout_s = idle_timeout_s
        self._server.batcher = _Batcher(retriever, max_batch, max_wait_s)
        self._server.default_k = default_k
        self._server.passages = len(retriever) if hasattr(retriever, "__len__") else -1
        self._thread: threading.Thread | None = None
        self._served = False

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> RetrieverServer:
        self._served = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="retriever-server", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._served = True
        self._server.serve_forever()

    def stop(self) -> None:
        if self._served:  # shutdown() waits for a serve_forever loop, so only call it if one ran
            self._server.shutdown()
        self._server.server_close()
        self._server.batcher.stop()

    def __enter__(self) -> RetrieverServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    from rl_llm.envs.knowledge import bundled_kb
    from rl_llm.envs.retrieval.bm25 import BM25Retriever
    from rl_llm.envs.retrieval.corpus import load_corpus
    from rl_llm.paths import cache_dir as package_cache_dir

    parser = ArgumentParser(description="Serve BM25 retrieval over a JSONL corpus on localhost.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", help='JSONL corpus with {"id","title","text"} lines')
    source.add_argument("--bundled", action="store_true", help="the bundled generated knowledge base")
    parser.add_argument("--seed", type=count_flag(0), default=0, help="seed of the bundled knowledge base")
    parser.add_argument("--host", type=host_flag, default="127.0.0.1")
    parser.add_argument("--port", type=port_flag, default=8000, help="TCP port, 0 to 65535 (0: any free one)")
    parser.add_argument("--topk", type=count_flag(1, MAX_TOPK), default=3,
                        help=f"passages per query when a request names no topk (1 to {MAX_TOPK})")
    parser.add_argument("--idle-timeout", type=seconds_flag(), default=60.0,
                        help="seconds a connection may stay quiet (mid-request or between requests) before it is closed")
    parser.add_argument("--cache-dir", default=None, help="index cache (default: $RL_LLM_CACHE/indexes or ~/.cache/rl-llm/indexes)")
    args = parser.parse_args(argv)
    passages = bundled_kb(args.seed).passages if args.bundled else load_corpus(args.corpus)
    cache_dir = args.cache_dir or package_cache_dir() / "indexes"
    server = RetrieverServer(BM25Retriever(passages, cache_dir=cache_dir), host=args.host, port=args.port,
                             default_k=args.topk, idle_timeout_s=args.idle_timeout)  # fmt: skip
    print(f"serving {len(passages)} passages at {server.url}/retrieve", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
