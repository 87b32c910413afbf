"""The retriever server: real HTTP on 127.0.0.1, concurrent clients in threads and in another process,
micro-batching, bad requests, and the Search environment using it."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import gymnasium as gym
import httpx
import pytest

import rl_llm  # noqa: F401
from rl_llm.envs.knowledge import bundled_kb
from rl_llm.envs.retrieval import BM25Retriever, RetrievalError, RetrieverClient, RetrieverServer


@pytest.fixture(scope="module")
def retriever():
    return BM25Retriever(bundled_kb().passages)


@pytest.fixture
def server(retriever):
    # A long linger so that concurrent requests are visibly merged into shared batches.
    with RetrieverServer(retriever, max_wait_s=0.02) as running:
        yield running


def test_concurrent_clients_get_the_same_results_as_the_in_process_index(server, retriever) -> None:
    names = [p.title for p in bundled_kb().passages[:64]]
    expected = retriever.search_batch(names, 3)
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def client_thread(worker: int) -> None:
        client = RetrieverClient(server.url)
        try:
            mine = names[worker::8]
            results[worker] = [client.search(name, 3) for name in mine[:4]] + client.search_batch(mine[4:], 3)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=client_thread, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    for worker, rows in results.items():
        assert rows == expected[worker::8]
    with RetrieverClient(server.url) as client:
        health = client.health()
    assert health["status"] == "ok" and health["passages"] == len(bundled_kb().passages)
    assert health["requests"] == 8 * 5
    assert health["batches"] < health["requests"]  # concurrent requests were answered together


def test_a_client_in_another_process_shares_the_server(server, retriever) -> None:
    code = (
        "import sys, json\n"
        "from rl_llm.envs.retrieval import RetrieverClient\n"
        "with RetrieverClient(sys.argv[1]) as client:\n"
        "    hits = client.search_batch(sys.argv[2:], 2)\n"
        "print(json.dumps([[h.passage.id for h in row] for row in hits]))\n"
    )
    queries = [p.title for p in bundled_kb().passages[100:103]]
    output = subprocess.run([sys.executable, "-c", code, server.url, *queries], capture_output=True, text=True,
                            timeout=120, check=True).stdout  # fmt: skip
    expected = [[h.passage.id for h in row] for row in retriever.search_batch(queries, 2)]
    assert output.strip() == str(expected).replace("'", '"')


def test_bad_requests_get_clear_errors(server) -> None:
    with httpx.Client() as http:
        wrong_type = http.post(server.url + "/retrieve", json={"queries": "Paris"})
        assert wrong_type.status_code == 400 and "list of strings" in wrong_type.json()["error"]
        bad_k = http.post(server.url + "/retrieve", json={"queries": ["x"], "topk": 1000})
        assert bad_k.status_code == 400 and "topk" in bad_k.json()["error"]
        not_json = http.post(server.url + "/retrieve", content=b"{oops")
        assert not_json.status_code == 400
        too_deep = http.post(server.url + "/retrieve", content=b"[" * 100_000)  # dropped the connection before
        assert too_deep.status_code == 400 and "nested too deeply" in too_deep.json()["error"]
        assert http.get(server.url + "/nowhere").status_code == 404
        plain = http.post(server.url + "/retrieve", json={"queries": [bundled_kb().passages[0].title], "topk": 1,
                                                            "return_scores": False})  # fmt: skip
        assert plain.json()["result"][0][0]["title"] == bundled_kb().passages[0].title  # Search-R1 layout
    with RetrieverClient(server.url) as client:
        assert client.search_batch([], 3) == []


@pytest.mark.parametrize("length", ["-1", "twelve"])
def test_a_bad_content_length_is_refused_at_once(server, length) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(f"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode())
        reply = b""
        while chunk := connection.recv(4096):  # the server closes the connection after refusing
            reply += chunk
    reply = reply.decode()
    assert reply.startswith("HTTP/1.1 400") and "Content-Length must be a non-negative integer" in reply


def test_client_reports_an_unreachable_server(retriever) -> None:
    server = RetrieverServer(retriever).start()
    url = server.url
    server.stop()
    with pytest.raises(RetrievalError, match="unreachable"), RetrieverClient(url, timeout=2) as client:
        client.search("anything")
    with pytest.raises(ValueError, match="http://"):
        RetrieverClient("localhost:8000")


def test_search_env_through_the_server_matches_the_in_process_index(server) -> None:
    remote = gym.make("rl-llm/Search-v0", retriever=server.url)
    local = gym.make("rl-llm/Search-v0")
    for env in (remote, local):
        env.reset(seed=5)
    question = remote.unwrapped.current_task
    for query in question.oracle_queries:
        assert remote.step(f"<search>{query}</search>")[0] == local.step(f"<search>{query}</search>")[0]
    assert remote.step(f"<answer>{question.answers[0]}</answer>")[1] == 1.0
    remote.close()
    local.close()


def test_search_env_reports_a_dead_server_as_an_observation(retriever) -> None:
    server = RetrieverServer(retriever).start()
    env = gym.make("rl-llm/Search-v0", retriever=server.url)
    server.stop()
    env.reset(seed=0)
    observation, _, terminated, _, info = env.step("<search>anything</search>")
    assert "search failed" in observation and "unreachable" in observation
    assert not terminated and info["metrics"]["tool_calls"] == 1
    env.close()


@pytest.mark.parametrize("env_id", ["rl-llm/Search-v0", "rl-llm/ToolCalls-v0"])
def test_an_env_closes_the_client_it_made_from_a_url_and_leaves_one_passed_in_open(server, env_id) -> None:
    """A URL spec makes the env a pooled HTTP client, its own: ``close()`` closes its connections (before, they
    stayed open until the env was garbage collected: a leak with many sessions on one server). A client
    passed in is its owner's and still works after the env is closed."""
    made = gym.make(env_id, retriever=server.url)
    client = made.unwrapped.retriever
    assert isinstance(client, RetrieverClient) and client.search_batch(["Paris"], 1)
    made.close()
    with pytest.raises(RuntimeError, match="client has been closed"):
        client.search("Paris")
    with RetrieverClient(server.url) as mine:
        passed = gym.make(env_id, retriever=mine)
        passed.close()
        assert mine.search_batch(["Paris"], 1)


def test_a_client_that_hangs_up_mid_request_costs_no_traceback(server, capsys) -> None:
    """A client that gives up (its own timeout, a crash) while the server reads its body or writes its answer:
    socketserver printed "Exception occurred during processing of request" and a traceback for each."""
    import struct
    import time

    host, port = server.url.removeprefix("http://").split(":")
    for body in (b'{"queries": ["Paris"]}', b'{"queries": ["Par'):  # the whole body, then half of one
        with socket.create_connection((host, int(port)), timeout=5) as connection:
            connection.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 22\r\n\r\n" + body)
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close: a reset
    time.sleep(0.5)  # the handler threads finish
    with httpx.Client() as http:
        assert http.post(server.url + "/retrieve", json={"queries": ["Paris"]}).status_code == 200
    assert "Traceback" not in capsys.readouterr().err


def test_a_chunked_body_is_refused_once_and_the_connection_closed(server) -> None:
    """Chunked bodies are not read: the chunks were parsed as a second request on the connection, which got a
    second (HTML) reply."""
    host, port = server.url.removeprefix("http://").split(":")
    body = b'{"queries": ["Paris"]}'
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                           + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))  # fmt: skip
        reply = b""
        while chunk := connection.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 411") and reply.count(b"HTTP/1.1") == 1 and b"Content-Length" in reply


def test_a_query_the_index_refuses_fails_only_its_own_request(retriever) -> None:
    """Concurrent requests are searched as one batch; when the index raised on one client's query, every client
    in that batch got the 500."""

    class Picky:
        def __len__(self) -> int:
            return len(retriever)

        def search_batch(self, queries, k):
            if "boom" in queries:
                raise UnicodeEncodeError("utf-8", "boom", 0, 1, "the tokenizer refuses it")
            return retriever.search_batch(queries, k)

    barrier = threading.Barrier(4)
    statuses: dict[str, int] = {}

    def ask(query: str) -> None:
        with httpx.Client(timeout=30) as http:
            barrier.wait()
            statuses[query] = http.post(server.url + "/retrieve", json={"queries": [query]}).status_code

    with RetrieverServer(Picky(), max_wait_s=0.5) as server:  # a long linger: the four share a batch
        threads = [threading.Thread(target=ask, args=(query,)) for query in ("boom", "Paris", "river", "capital")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert statuses == {"boom": 500, "Paris": 200, "river": 200, "capital": 200}


@pytest.mark.parametrize("sent", [b"", b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 22\r\n\r\n" + b'{"que'])
def test_a_connection_that_goes_quiet_is_closed_after_the_idle_timeout(retriever, sent) -> None:
    """Each connection holds a server thread: one that connects and never sends, or stops mid-body, held it for
    good (no socket timeout), and enough of them exhausted the process. Now closed once quiet for the timeout,
    with no answer to a request that never arrived whole, and the server goes on answering."""
    with RetrieverServer(retriever, idle_timeout_s=0.3) as server:
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as connection:
            connection.sendall(sent)
            assert connection.recv(4096) == b""  # closed by the server, before this side's 10 s
        with httpx.Client() as http:
            assert http.post(server.url + "/retrieve", json={"queries": ["Paris"]}).status_code == 200


def test_the_idle_timeout_must_be_positive(retriever) -> None:
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="idle_timeout_s must be a positive number"):
            RetrieverServer(retriever, idle_timeout_s=bad)


def test_a_query_with_a_lone_surrogate_is_searched_with_u_fffd_in_its_place(server, retriever) -> None:
    """An LLM's text may hold a lone surrogate, which no UTF-8 encoder takes: the request was never sent and the
    env said "search failed: 'utf-8' codec can't encode ...". It is sent with U+FFFD in its place, the servers'
    rule, and finds what the in-process index finds."""
    remote = gym.make("rl-llm/Search-v0", retriever=server.url)
    local = gym.make("rl-llm/Search-v0")
    for env in (remote, local):
        env.reset(seed=5)
    query = remote.unwrapped.current_task.oracle_queries[0] + " \ud800"
    observation = remote.step(f"<search>{query}</search>")[0]
    assert "search failed" not in observation and observation == local.step(f"<search>{query}</search>")[0]
    assert "Doc 1" in observation
    with RetrieverClient(server.url) as client:
        assert client.search("Paris\udfff", 2) == retriever.search("Paris\ufffd\ufffd\ufffd", 2)
    remote.close()
    local.close()


@pytest.mark.parametrize(("body", "needle"), [
    ({"result": [5]}, "no 'result' list per query"),  # a row that is not a list: a TypeError out of the step
    ({"result": [[{"document": {"text": "x"}, "score": None}]]}, "score None is not a number"),  # float(None)
    ({"result": [[{"document": {"text": "x"}, "score": "high"}]]}, "score 'high' is not a number"),
    (b"[" * 100_000 + b"]" * 100_000, "invalid JSON (nested too deeply)"),  # was a RecursionError
])  # fmt: skip
def test_a_malformed_retriever_reply_is_reported_to_the_agent_not_raised(body, needle) -> None:
    from tests.agents.stub_servers import RawStub, write_response

    stub = RawStub(lambda handler, *_: write_response(handler, 200, body))
    env = gym.make("rl-llm/Search-v0", retriever=stub.url)
    try:
        env.reset(seed=0)
        observation, _, terminated, _, _ = env.step("<search>Paris</search>")
        assert "search failed" in observation and needle in observation and not terminated
        assert "search failed" in env.step("<search>Paris</search>")[0]  # the env is still usable
    finally:
        env.close()
        stub.close()


RETRIEVER = "rl_llm.envs.retrieval.server"


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--port", "70000", "must be an integer in 0..65535"), ("--host", "bad host", "'bad host' is not a host name"),
    ("--topk", "0", "must be an integer in 1..100"), ("--topk", "1000", "must be an integer in 1..100"),
    ("--idle-timeout", "inf", "must be a positive number of seconds"), ("--idle-timeout", "1e30", "must be a positive"),
    ("--seed", "-1", "must be an integer >= 0"),
])  # fmt: skip
def test_the_servers_bad_flags_exit_2_with_one_line_naming_the_flag(flag: str, value: str, message: str) -> None:
    """Before, --topk 0 served and refused every request without a topk, --idle-timeout inf overflowed on every
    connection, --port 70000 and --seed -1 were tracebacks."""
    result = subprocess.run([sys.executable, "-m", RETRIEVER, "--bundled", f"{flag}={value}"], capture_output=True,
                            text=True, timeout=30)  # fmt: skip
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"error: argument {flag}: {message}" in errors[0]


@pytest.mark.parametrize(("name", "value"), [
    ("default_k", 0), ("default_k", 101), ("default_k", True), ("max_batch", 0), ("max_wait_s", -1.0),
    ("max_wait_s", float("nan")), ("idle_timeout_s", float("inf")), ("idle_timeout_s", 1e30), ("port", 70000),
    ("port", -1), ("host", "bad host"), ("host", ""),
])  # fmt: skip
def test_the_constructor_refuses_a_bad_setting_naming_it(retriever, name: str, value: object) -> None:
    """A negative or NaN max_wait_s killed the batcher thread: every request then waited 300 s."""
    with pytest.raises(ValueError, match=f"^{name} "):
        RetrieverServer(retriever, **{name: value})


def test_edge_settings_serve(retriever) -> None:
    with RetrieverServer(retriever, host="localhost", default_k=100, max_batch=1, max_wait_s=0) as server:
        title = bundled_kb().passages[0].title
        with RetrieverClient(server.url) as client:
            assert client.search(title, 1) == retriever.search(title, 1)
        with httpx.Client() as http:  # no topk: default_k, the largest allowed
            assert len(http.post(server.url + "/retrieve", json={"queries": [title]}).json()["result"][0]) > 3
