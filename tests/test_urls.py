"""rl_llm/urls.py: one check of "requests can be sent to this server URL" for every client (the LLM backends,
the env server's client, the retriever client), one wording, and credentials kept out of messages."""

from __future__ import annotations

import pytest

from rl_llm.agents.openai_backend import OpenAIPolicy
from rl_llm.envs.retrieval.client import RetrieverClient
from rl_llm.integrations.http_client import EnvClient, EnvServerUnavailable
from rl_llm.urls import check_server_url, shown_url

BAD_URLS = [
    ("http://127.0.0.1:99999/v1", "with a port in 1-65535"),  # httpx failed only at the first request
    ("http://127.0.0.1:abc/v1", r"that parses \(Invalid port"),
    ("http://", "with a host"),
    ("http://127.0.0.1:8000/v1?key=x", "without a query or fragment"),  # the request path went after the query
    ("ftp://127.0.0.1", "starting with http:// or https://"),
    ("localhost:8000", "starting with http:// or https://"),
    ("", "starting with http:// or https://"),
    (5, r"\(a string\)"),
]  # fmt: skip


@pytest.mark.parametrize(("url", "says"), BAD_URLS)
def test_a_url_no_request_could_reach_is_refused_naming_the_argument_and_why(url: object, says: str) -> None:
    with pytest.raises(ValueError, match=rf"^base_url must be a server URL {says}") as refused:
        check_server_url("base_url", url)
    assert str(refused.value).endswith(f", such as http://127.0.0.1:8000, got {url!r}")


@pytest.mark.parametrize(("url", "says"), BAD_URLS)
def test_every_client_refuses_it_when_made_in_the_same_words(url: object, says: str) -> None:
    """The env server's client took a port out of range or a query (the first request then failed deep in
    httpx), and the retriever client any string starting with http://."""
    for make in (lambda: EnvClient(url), lambda: RetrieverClient(url), lambda: OpenAIPolicy(url, "m")):
        with pytest.raises(ValueError, match=f"server URL {says}"):
            make()


def test_good_urls_pass_unchanged() -> None:
    for url in ("http://127.0.0.1:8000", "https://api.example.com/v1/", "HTTP://host:1/v1", "http://[::1]:65535"):
        assert check_server_url("base_url", url) == url


def test_credentials_stay_out_of_the_messages() -> None:
    assert shown_url("https://me:sk-secret@host/v1") == "https://***@host/v1"
    assert shown_url("https://sk-secret@host/v1") == "https://***@host/v1"
    with pytest.raises(ValueError) as refused:
        check_server_url("base_url", "http://me:sk-secret@127.0.0.1:99999/v1")
    assert "sk-secret" not in str(refused.value) and "***@" in str(refused.value)


def test_the_env_and_retriever_clients_name_an_unreachable_server_without_its_credentials() -> None:
    url = "http://me:sk-secret@127.0.0.1:9"  # the discard port: nothing listens there
    with EnvClient(url, timeout=5) as client, pytest.raises(EnvServerUnavailable) as lost:
        client.create("rl-llm/MultiArmedBandit-v0")
    assert "sk-secret" not in str(lost.value) and "127.0.0.1:9" in str(lost.value)
    with RetrieverClient(url, timeout=5) as retriever, pytest.raises(Exception) as unreachable:
        retriever.search("anything")
    assert "sk-secret" not in str(unreachable.value) and "unreachable" in str(unreachable.value)


@pytest.mark.parametrize(("arguments", "message"), [
    ({"max_batch": 0}, "^max_batch must be an integer >= 1, got 0$"),
    ({"max_batch": 2.5}, "^max_batch must be an integer"),
    ({"timeout": float("nan")}, "^timeout must be a positive number of seconds"),
    ({"timeout": 0}, "^timeout must be a positive number of seconds"),
])  # fmt: skip
def test_the_retriever_client_checks_its_settings_when_made(arguments: dict, message: str) -> None:
    """max_batch=0 was range()'s "arg 3 must not be zero" at the first search; a NaN timeout went to httpx."""
    with pytest.raises(ValueError, match=message):
        RetrieverClient("http://127.0.0.1:8000", **arguments)
