"""The HTTP backends against real misbehaving servers on 127.0.0.1: each fault is a clear ``BackendError`` (or a
``ValueError`` for a spec no request could be sent to), never a hang, a raw httpx error or a silent wrong result."""

from __future__ import annotations

import gzip
import json
import queue
import re
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from rl_llm.agents import make_policy
from rl_llm.agents.http_client import BackendError
from rl_llm.agents.llm import GenerationRequest
from rl_llm.agents.openai_backend import OpenAIPolicy
from rl_llm.agents.vllm_server import VLLMServerPolicy
from rl_llm.types import Message
from tests.agents.stub_servers import EndlessBody, RawStub, write_response

Reply = Callable[[BaseHTTPRequestHandler, str, str], None]


@pytest.fixture
def serve() -> Iterator[Callable[[Reply], RawStub]]:
    servers: list[RawStub] = []

    def start(reply: Reply) -> RawStub:
        servers.append(RawStub(reply))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def chat(server: RawStub, **options: Any) -> OpenAIPolicy:
    options = {"timeout_s": 5.0, "max_retries": 1, "backoff_s": 0.01, **options}
    return OpenAIPolicy(server.url, "stub-model", api_key="sk-test", **options)


def ask(policy: Any, **request: Any) -> Any:
    request.setdefault("messages", [Message("user", "hi")])
    try:
        return policy.generate([GenerationRequest(**request)])[0]
    finally:
        policy.close()


def test_a_body_trickled_past_the_timeout_is_a_timeout_not_a_hang(serve: Callable[[Reply], RawStub]) -> None:
    def trickle(handler: BaseHTTPRequestHandler, method: str, path: str) -> None:
        handler.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(100):  # 20 s, one byte at a time: each read is well within httpx's per-read timeout
            handler.wfile.write(b" ")
            handler.wfile.flush()
            time.sleep(0.2)

    started = time.monotonic()
    with pytest.raises(BackendError, match=r"no response within 1s \(timeout\)"):
        ask(chat(serve(trickle), timeout_s=1.0, max_retries=0))
    assert time.monotonic() - started < 5


def test_a_body_that_does_not_decode_is_a_malformed_response(serve: Callable[[Reply], RawStub]) -> None:
    server = serve(lambda handler, *_: write_response(handler, 200, b"not gzip", {"Content-Encoding": "gzip"}))
    with pytest.raises(BackendError, match=r"failed after 2 attempt\(s\): malformed response \(the body does not decode"):
        ask(chat(server))
    assert len(server.requests) == 2


def test_a_redirect_is_not_followed_and_says_where_it_points(serve: Callable[[Reply], RawStub]) -> None:
    elsewhere = "https://api.example.com/v1/chat/completions"
    server = serve(lambda handler, *_: write_response(handler, 307, b"", {"Location": elsewhere}))
    with pytest.raises(BackendError, match=rf"redirected \(HTTP 307\) to {elsewhere}"):
        ask(chat(server))
    assert len(server.requests) == 1, "a redirect is answered the same every time: not retried"


@pytest.mark.parametrize("spec", [
    "openai:http://127.0.0.1:99999/v1#m",  # anyio's ExceptionGroup(OverflowError) at the first request, before
    "openai:http://127.0.0.1:abc/v1#m",  # httpx.InvalidURL at the first request
    "openai:http://#m",  # no host: a DNS failure for "" on every request
    "openai:http://127.0.0.1:8000/v1?key=x#m",  # the path would go after the query
    "vllm:HTTP://127.0.0.1:99999/v1#m",  # an upper-case scheme was not a server: in-process vLLM tried "HTTP://..."
])  # fmt: skip
def test_a_server_url_no_request_could_reach_is_refused_when_the_agent_is_made(spec: str) -> None:
    with pytest.raises(ValueError, match="server URL"):
        make_policy(spec, "rl-llm/TicTacToe-v0")


def test_credentials_in_a_server_url_stay_out_of_names_and_errors(serve: Callable[[Reply], RawStub]) -> None:
    """A policy's name goes into every trajectory record and bench result, its errors into logs: a key written
    in the URL (``https://user:KEY@host``) was in all of them."""
    failing = serve(lambda handler, *_: write_response(handler, 400, {"error": "bad request"}))
    url = failing.url.replace("http://", "http://me:sk-secret-123@")
    policy = OpenAIPolicy(url, "stub-model", timeout_s=5.0, max_retries=0)
    assert policy.name == f"openai:{failing.url.replace('http://', 'http://***@')}#stub-model"
    with pytest.raises(BackendError) as error:
        ask(policy)
    assert "sk-secret-123" not in str(error.value) and "***@" in str(error.value)


def _chat_reply(message: dict[str, Any], finish: str) -> Reply:
    body = {"choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}]}
    return lambda handler, *_: write_response(handler, 200, body)


def test_null_content_is_no_answer_to_play(serve: Callable[[Reply], RawStub]) -> None:
    refused = serve(_chat_reply({"content": None, "refusal": "I can't help with that."}, "stop"))
    with pytest.raises(BackendError, match=r"content is null \(finish_reason 'stop', refusal: \"I can't help"):
        ask(chat(refused))
    # the budget ran out before any text (a reasoning model): an empty turn, which records finish_reason "length"
    completion = ask(chat(serve(_chat_reply({"content": None}, "length"))))
    assert (completion.text, completion.finish_reason) == ("", "length")


@pytest.mark.parametrize("finish", [5, {}, [], True])
def test_a_finish_reason_that_is_not_a_string_is_a_malformed_response(
    serve: Callable[[Reply], RawStub], finish: Any
) -> None:
    server = serve(_chat_reply({"content": "hello"}, finish))  # was taken, with finish_reason None
    with pytest.raises(BackendError, match=rf"/chat/completions failed after 2 attempt\(s\): malformed response "
                                           rf"\(choices\[0\].finish_reason {re.escape(repr(finish))} is not a string"):
        ask(chat(server))
    assert len(server.requests) == 2  # retried, as other malformed bodies are


@pytest.mark.parametrize(("body", "reason"), [
    ({"choices": {"0": {}}}, r"no 'choices' list"),
    ({"choices": [{"message": "hi"}]}, r"choices\[0\] has no 'message' object"),
    ({"choices": [{"message": {"content": 5}, "finish_reason": "stop"}]}, r"choices\[0\].message.content is not a"),
    (b"[" * 100_000 + b"]" * 100_000, r"JSON nested too deeply"),  # was a RecursionError out of the client
])  # fmt: skip
def test_a_chat_reply_of_the_wrong_shape_is_a_malformed_response_naming_the_field(
    serve: Callable[[Reply], RawStub], body: Any, reason: str
) -> None:
    server = serve(lambda handler, *_: write_response(handler, 200, body))
    with pytest.raises(BackendError, match=rf"/chat/completions failed after 2 attempt\(s\): malformed response "
                                           rf"\({reason}"):
        ask(chat(server))


# -- bodies too large to hold: an endless one, a huge one, a compression bomb ---------------------------------
CAP = 64 * 1024  # max_response_bytes in these tests, small to keep them fast
TOO_LARGE = r"malformed response \(the body{} is larger than max_response_bytes={} \({}\), the most"


def test_an_endless_body_is_cut_at_the_limit(serve: Callable[[Reply], RawStub]) -> None:
    endless = EndlessBody(most=100 * CAP)  # a client that reads it all fails on the body, not by hanging
    server = serve(endless)
    # retried, as other malformed bodies are: each try costs at most the limit
    retried = re.escape(f"POST {server.url}/chat/completions failed after 2 attempt(s): ")
    with pytest.raises(BackendError, match=retried + TOO_LARGE.format("", CAP, "64 KiB")):
        ask(chat(server, max_response_bytes=CAP))
    sent = endless.ended(connections=2)
    assert all(count < 10 * CAP for count in sent), f"the client read on past the limit: {sent} bytes sent"


def test_a_body_whose_content_length_is_over_the_limit_is_refused_before_it_is_read(
    serve: Callable[[Reply], RawStub],
) -> None:
    hung_up: queue.Queue[bool] = queue.Queue()  # per connection: whether the client closed it unread

    def huge(handler: BaseHTTPRequestHandler, method: str, path: str) -> None:
        # a terabyte, not one byte of it sent: the stub waits for the client to hang up
        handler.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\n\r\n")
        handler.connection.settimeout(5.0)
        try:
            hung_up.put(handler.connection.recv(1) == b"")
        except TimeoutError:
            hung_up.put(False)

    # the default limit (64 MiB): a client that waits for the body waits into its timeout
    declared = r" \(its Content-Length is 1099511627776\)"
    with pytest.raises(BackendError, match=TOO_LARGE.format(declared, 2**26, "64 MiB")):
        ask(chat(serve(huge), timeout_s=2.0))
    closed = [hung_up.get(timeout=10) for _ in range(2)]
    assert closed == [True, True], "the client closes the connection at once, not at its timeout"


@pytest.mark.parametrize("coding", ["gzip", "gzip, gzip"])
def test_a_compression_bomb_is_refused_as_it_inflates(serve: Callable[[Reply], RawStub], coding: str) -> None:
    bomb = bytes(48 * 2**20)  # 48 MiB of zeros: 48 KB gzipped (under the limit), 250 bytes gzipped twice
    for _ in coding.split(","):
        bomb = gzip.compress(bomb)
    server = serve(lambda handler, *_: write_response(handler, 200, bomb, {"Content-Encoding": coding}))
    policy = chat(server, max_response_bytes=CAP)
    tracemalloc.start()
    try:
        with pytest.raises(BackendError, match=TOO_LARGE.format(r" \(decoded\)", CAP, "64 KiB")):
            ask(policy)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, f"{peak} bytes at the peak: the bomb inflated before it was refused"


def _chat_body(size: int) -> bytes:
    """A chat completion of exactly ``size`` bytes of JSON (its content padded)."""
    choice = {"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "length"}
    empty = json.dumps({"choices": [choice]}).encode()
    return empty.replace(b'"content": ""', b'"content": "' + b"x" * (size - len(empty)) + b'"')


def _raw_deflate(data: bytes) -> bytes:
    deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return deflate.compress(data) + deflate.flush()


CODINGS: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "identity": ("identity", lambda data: data),
    "gzip": ("gzip", gzip.compress),
    "deflate": ("deflate", zlib.compress),
    "raw deflate": ("deflate", _raw_deflate),  # what some servers send as deflate
}


@pytest.mark.parametrize("coding", list(CODINGS))
def test_a_reply_of_the_limit_is_taken_and_one_byte_more_is_not(
    serve: Callable[[Reply], RawStub], coding: str
) -> None:
    name, encode = CODINGS[coding]
    body = encode(_chat_body(CAP))
    server = serve(lambda handler, *_: write_response(handler, 200, body, {"Content-Encoding": name}))
    assert ask(chat(server, max_response_bytes=CAP)).text == "x" * (CAP - len(_chat_body(0)))
    with pytest.raises(BackendError, match=r"is larger than max_response_bytes=65535 \(64 KiB\)"):
        ask(chat(server, max_response_bytes=CAP - 1))


# -- the vLLM server client: token ids and log-probs are what the trainer learns from ----------------------
def _completions(tokens: list[Any], logprobs: list[Any] | bytes, finish: Any = "stop") -> bytes:
    values = logprobs.decode() if isinstance(logprobs, bytes) else ", ".join(map(repr, logprobs)).replace("'", '"')
    quoted = ", ".join(f'"token_id:{token}"' for token in tokens)
    finish_json = f'"{finish}"' if isinstance(finish, str) else "null"
    return (f'{{"choices": [{{"index": 0, "text": "", "finish_reason": {finish_json}, '
            f'"logprobs": {{"tokens": [{quoted}], "token_logprobs": [{values}]}}}}]}}').encode()  # fmt: skip


def vllm_client(server: RawStub, tokenizer_dir: Path, **options: Any) -> VLLMServerPolicy:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    options = {"timeout_s": 5.0, "max_retries": 0, **options}
    return VLLMServerPolicy(server.url, "stub-model", tokenizer=tokenizer, **options)


def test_the_vllm_client_takes_a_well_formed_completion(serve: Callable[[Reply], RawStub], tiny_model_dir: Path) -> None:
    server = serve(lambda handler, *_: write_response(handler, 200, _completions([5, 6], [-0.25, 0.0])))
    completion = ask(vllm_client(server, tiny_model_dir), prompt_ids=[1, 2], max_new_tokens=4)
    assert completion.token_ids == [5, 6] and completion.logprobs == [-0.25, 0.0]
    assert completion.finish_reason == "stop" and completion.text


@pytest.mark.parametrize(("body", "reason"), [
    (_completions(list(range(5, 15)), [-0.1] * 10), r"10 tokens for a request of at most 4"),
    (_completions([], []), r"0 tokens for a request of at most 4"),
    (_completions([5], [-0.1], finish="abort"), r"finish_reason 'abort': the server did not finish"),
    (_completions([5], [-0.1], finish=None), r"finish_reason None"),
    (_completions([-1], [-0.1]), r"token id -1 is out of range"),  # was an OverflowError from the tokenizer
    (_completions([5, 2**32], [-0.1, -0.1]), r"token id 4294967296 is out of range"),
    (_completions(["abc"], [-0.1]), r"expected tokens as 'token_id:N' \(return_tokens_as_token_ids\), got "
                                    r"'token_id:abc'"),  # was "invalid literal for int\(\)"
    (_completions([5, 6], b"-0.1, NaN"), r"token_logprobs are not all finite numbers <= 0: \[nan\]"),
    (_completions([5], [2.5]), r"token_logprobs are not all finite numbers <= 0: \[2.5\]"),
    (_completions([5], ["-0.5"]), r"token_logprobs are not all finite numbers <= 0: \['-0.5'\]"),
])  # fmt: skip
def test_the_vllm_client_refuses_tokens_and_logprobs_that_are_not_a_generation(
    serve: Callable[[Reply], RawStub], tiny_model_dir: Path, body: bytes, reason: str
) -> None:
    server = serve(lambda handler, *_: write_response(handler, 200, body))
    with pytest.raises(BackendError, match=rf"malformed response \({reason}"):
        ask(vllm_client(server, tiny_model_dir), prompt_ids=[1, 2], max_new_tokens=4)


@pytest.mark.parametrize("models", [{"data": 5}, {"data": [{"id": "stub-model", "max_model_len": True}]},
                                    {"data": [{"id": "stub-model", "max_model_len": 0}]}])  # fmt: skip
def test_an_odd_model_list_gives_no_context_window(
    serve: Callable[[Reply], RawStub], tiny_model_dir: Path, models: dict[str, Any]
) -> None:
    policy = vllm_client(serve(lambda handler, *_: write_response(handler, 200, models)), tiny_model_dir)
    assert getattr(policy, "max_context_tokens", None) is None
    policy.close()


def test_the_vllm_client_caps_its_bodies_too(serve: Callable[[Reply], RawStub], tiny_model_dir: Path) -> None:
    endless = EndlessBody(most=100 * CAP)
    policy = vllm_client(serve(endless), tiny_model_dir, max_response_bytes=CAP)
    assert getattr(policy, "max_context_tokens", None) is None  # an endless model list: no context window
    with pytest.raises(BackendError, match=TOO_LARGE.format("", CAP, "64 KiB")):
        ask(policy, prompt_ids=[1, 2], max_new_tokens=4)
    sent = endless.ended(connections=2)  # GET /v1/models, POST /v1/completions
    assert all(count < 10 * CAP for count in sent), f"the client read on past the limit: {sent} bytes sent"


def test_a_retry_after_a_malformed_reply_sends_the_same_request_seed_included(
    serve: Callable[[Reply], RawStub], tiny_model_dir: Path
) -> None:
    # A seeded request is drawn the same way again on its retry (docs/vllm.md#seeded-draws): the same body.
    replies = iter([_completions([5], [-0.1], finish="abort"), _completions([5, 6], [-0.25, 0.0])])
    def reply(handler: BaseHTTPRequestHandler, method: str, path: str) -> None:  # GET /v1/models: no list
        if method == "POST":
            write_response(handler, 200, next(replies))
        else:
            write_response(handler, 404, {})

    server = serve(reply)
    policy = vllm_client(server, tiny_model_dir, max_retries=1, seed=7)
    completion = ask(policy, prompt_ids=[1, 2], max_new_tokens=4, metadata={"seed": 3, "turn": 0})
    assert completion.token_ids == [5, 6]
    sent = [json.loads(body) for body in server.bodies if body]
    assert len(sent) == 2 and sent[0] == sent[1] and isinstance(sent[0]["seed"], int)
