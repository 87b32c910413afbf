"""Settings an operator or user gives the env servers and the HTTP client, fuzzed: each bad value is refused
where it is given, with one line naming the flag or argument, not accepted to misbehave later (a server that
times out or refuses every request, never reaps, binds port 70000 as 4464) nor met deep inside with a
traceback. Command lines run the real modules in a subprocess; Python settings build the real objects."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rl_llm.checks import MAX_SECONDS
from rl_llm.integrations.http_client import EnvClient, EnvServerError
from rl_llm.integrations.http_server import BackgroundServer, EnvServer, ServerConfig
from tests.extras import import_extra
from tests.integrations.test_http_server import TTT

HTTP_SERVER = "rl_llm.integrations.http_server"
OPENENV = "rl_llm.integrations.openenv"
NAN, INF = float("nan"), float("inf")


@pytest.fixture
def openenv() -> None:
    """The OpenEnv server's cases skip without openenv-core (the dev extra has none), and fail where the run
    requires the extra."""
    import_extra("openenv.core", "openenv", "openenv-core: pip install 'rl-llm[openenv]'")


def run_cli(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    # On the old code most of these started a server that ran on: the timeout makes that a failure.
    return subprocess.run([sys.executable, "-m", module, *args, "--port=0"] if "--port" not in " ".join(args)
                          else [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=20)  # fmt: skip


def assert_flag_refused(result: subprocess.CompletedProcess[str], flag: str, message: str) -> None:
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert re.search(f"error: argument {flag}: {message}", errors[0]), errors[0]


WHOLE = "must be an integer"
SECONDS = "must be a positive number of seconds"
ADDRESS = "(must be a host name|.* is not a host name or IP address)"
SERVER_FLAGS = [
    ("--port", "70000", WHOLE + " in 0..65535"), ("--port=-1", None, WHOLE), ("--port", "http", "expected an integer"),
    ("--host", "not a host!!", ADDRESS), ("--host", "", ADDRESS),
    ("--max-sessions", "0", WHOLE + " >= 1"), ("--max-sessions=-3", None, WHOLE), ("--max-sessions", "2.5", "expected"),
    ("--max-workers", "0", WHOLE), ("--step-timeout-s", "nan", SECONDS), ("--step-timeout-s", "inf", SECONDS),
    ("--step-timeout-s", "0", SECONDS), ("--step-timeout-s", "1e30", SECONDS), ("--step-timeout-s", "soon", "expected a number"),
    ("--session-ttl-s", "nan", SECONDS), ("--session-ttl-s=-1", None, SECONDS),
    ("--env", "rl-llm/Nope-v0", "unknown env id 'rl-llm/Nope-v0'"),
]  # fmt: skip


@pytest.mark.parametrize(("flag", "value", "message"), SERVER_FLAGS)
def test_the_env_servers_bad_flags_exit_2_with_one_line_naming_the_flag(flag: str, value: str | None, message: str) -> None:
    result = run_cli(HTTP_SERVER, flag, *([value] if value is not None else []))
    assert_flag_refused(result, flag.partition("=")[0], message)


OPENENV_FLAGS = [
    ("--port", "70000", WHOLE), ("--host", "bad host", ADDRESS), ("--max-sessions", "0", WHOLE),
    ("--max-episodes", "0", WHOLE), ("--episode-ttl-s", "nan", SECONDS), ("--episode-ttl-s", "inf", SECONDS),
    ("--episode-ttl-s", "0", SECONDS),
]  # fmt: skip


@pytest.mark.parametrize(("flag", "value", "message"), OPENENV_FLAGS)
@pytest.mark.usefixtures("openenv")
def test_the_openenv_servers_bad_flags_exit_2_with_one_line_naming_the_flag(flag: str, value: str, message: str) -> None:
    assert_flag_refused(run_cli(OPENENV, "--env", TTT, flag, value), flag, message)


def test_the_env_server_starts_with_edge_values_and_serves() -> None:
    """The smallest and largest values allowed still give a working server (on a free port, localhost)."""
    process = subprocess.Popen(
        [sys.executable, "-m", HTTP_SERVER, "--host", "localhost", "--port", "0", "--max-sessions", "1",
         "--max-workers", "1", "--step-timeout-s", str(MAX_SECONDS), "--session-ttl-s", "0.5", "--env", TTT],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        for line in process.stderr:  # uvicorn says where it listens once it does
            if found := re.search(r"running on (http://\S+)", line, re.IGNORECASE):
                break
        else:
            pytest.fail("the server did not start")
        with EnvClient(found[1]) as client:
            assert client.env_ids() == [TTT]
            client.make(TTT).reset(seed=0)
            with pytest.raises(EnvServerError, match="max_sessions=1 reached"):
                client.create(TTT)
    finally:
        process.terminate()
        process.wait(20)


# -- ServerConfig ---------------------------------------------------------------------------------------------
BAD_CONFIGS = [
    ("max_sessions", 0), ("max_sessions", -1), ("max_sessions", True), ("max_sessions", 2.5), ("max_workers", 0),
    ("max_queued", 0), ("max_body_bytes", 0), ("step_timeout_s", NAN), ("step_timeout_s", INF), ("step_timeout_s", 0),
    ("step_timeout_s", -1.0), ("step_timeout_s", 1e30), ("step_timeout_s", True), ("step_timeout_s", "60"),
    ("create_timeout_s", NAN), ("session_ttl_s", NAN), ("session_ttl_s", -1), ("reap_interval_s", 0),
    ("inline_budget_s", -0.001), ("inline_budget_s", NAN),
    ("allowed_env_ids", TTT), ("allowed_env_ids", [1]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value"), BAD_CONFIGS)
def test_server_config_refuses_a_bad_value_naming_the_field(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"^{name} must be"):
        ServerConfig(**{name: value})


def test_a_string_of_allowed_env_ids_no_longer_allows_its_substrings() -> None:
    """It was searched as text, so env id "rl" counted as allowed inside "rl-llm/TicTacToe-v0"."""
    with pytest.raises(ValueError, match="allowed_env_ids must be a set of env id strings"):
        EnvServer(ServerConfig(allowed_env_ids=TTT))  # type: ignore[arg-type]


def test_server_config_edge_values_serve() -> None:
    config = ServerConfig(allowed_env_ids=[TTT], max_sessions=1, max_workers=1, max_queued=1, step_timeout_s=1,  # type: ignore[arg-type]
                          session_ttl_s=MAX_SECONDS, inline_budget_s=0, max_body_bytes=4096)  # fmt: skip
    assert config.allowed_env_ids == frozenset({TTT}) and config.step_timeout_s == 1.0
    with BackgroundServer(EnvServer(config).app) as background, EnvClient(background.url, busy_retries=0) as client:
        observation, _ = client.make(TTT).reset(seed=1)
        assert "Legal moves" in observation


# -- create_openenv_app ---------------------------------------------------------------------------------------
BAD_APP_ARGUMENTS = [
    ("max_sessions", 0, "max_sessions must be"), ("max_sessions", True, "max_sessions must be"),
    ("max_episodes", 0, "max_episodes must be"), ("episode_ttl_s", NAN, "episode_ttl_s must be"),
    ("episode_ttl_s", INF, "episode_ttl_s must be"), ("episode_ttl_s", 0, "episode_ttl_s must be"),
    ("max_body_bytes", 0, "max_body_bytes must be"), ("env_kwargs", ["opponent"], "env_kwargs must be a dict"),
    ("env_kwargs", "opponent=minimax", "env_kwargs must be a dict"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value", "message"), BAD_APP_ARGUMENTS)
@pytest.mark.usefixtures("openenv")
def test_create_openenv_app_refuses_a_bad_argument_naming_it(name: str, value: Any, message: str) -> None:
    from rl_llm.integrations.openenv import create_openenv_app

    with pytest.raises(ValueError, match=f"^{message}"):
        create_openenv_app(TTT, **{name: value})


@pytest.mark.usefixtures("openenv")
def test_create_openenv_app_edge_values_build() -> None:
    from fastapi.testclient import TestClient

    from rl_llm.integrations.openenv import create_openenv_app

    app = create_openenv_app(TTT, {}, max_sessions=1, max_episodes=1, episode_ttl_s=MAX_SECONDS)
    with TestClient(app) as http:
        reply = http.post("/reset", json={"seed": 0, "episode_id": "e1"}).json()
        assert "Legal moves" in reply["observation"]["text"]
        assert http.post("/step", json={"action": {"message": "<move>B2</move>"}, "episode_id": "e1"}).status_code == 200


# -- the HTTP client --------------------------------------------------------------------------------------------
BAD_CLIENT_ARGUMENTS = [
    ({"base_url": "not a url"}, "base_url must be"), ({"base_url": ""}, "base_url must be"),
    ({"base_url": "ftp://x"}, "base_url must be"), ({"base_url": 5}, "base_url must be"),
    ({"base_url": "http://"}, "base_url must be"), ({"timeout": 0}, "timeout must be"), ({"timeout": NAN}, "timeout must be"),
    ({"timeout": INF}, "timeout must be"), ({"timeout": -1}, "timeout must be"), ({"timeout": True}, "timeout must be"),
    ({"busy_retries": -1}, "busy_retries must be"), ({"busy_retries": 1.5}, "busy_retries must be"),
    ({"busy_retries": True}, "busy_retries must be"),
]  # fmt: skip


@pytest.mark.parametrize(("arguments", "message"), BAD_CLIENT_ARGUMENTS)
def test_the_client_refuses_a_bad_argument_when_made(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}"):
        EnvClient(**{"base_url": "http://127.0.0.1:8000", **arguments})


@pytest.fixture(scope="module")
def served_url() -> Any:
    with BackgroundServer(EnvServer(ServerConfig(allowed_env_ids=frozenset({TTT}))).app) as background:
        yield background.url


@pytest.mark.parametrize("session_id", ["?x=1", "a/b", "../stats", "#frag"])
def test_a_session_id_is_one_path_segment_so_a_strange_one_is_a_404(served_url: str, session_id: str) -> None:
    """"?x=1" reached POST /sessions/ with a query: a non-JSON reply raised JSONDecodeError."""
    with EnvClient(served_url, busy_retries=0) as client, pytest.raises(EnvServerError) as refused:
        client.step(session_id, "<move>B2</move>")
    assert refused.value.status == 404


@pytest.mark.parametrize("session_id", ["", 5, None])
def test_a_session_id_that_is_not_a_string_is_refused_before_sending(served_url: str, session_id: Any) -> None:
    with EnvClient(served_url) as client, pytest.raises(ValueError, match="session_id must be a non-empty string"):
        client.reset(session_id)


def test_batches_of_unequal_lengths_name_the_short_column(served_url: str) -> None:
    with EnvClient(served_url) as client:
        with pytest.raises(ValueError, match="seeds has 1 items for 2 session_ids"):
            client.reset_batch(["a", "b"], [1])
        with pytest.raises(ValueError, match="actions has 3 items for 2 session_ids"):
            client.step_batch(["a", "b"], ["x", "y", "z"])


def test_a_base_url_that_is_not_an_env_server_is_an_env_server_error_naming_it() -> None:
    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "13")
            self.end_headers()
            self.wfile.write(b"<html></html>")

        def log_message(self, *_: Any) -> None:
            pass

    page = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=page.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{page.server_address[1]}"
    try:
        with EnvClient(url) as client, pytest.raises(EnvServerError, match=r"non-JSON.*an rl-llm env server"):
            client.env_ids()
    finally:
        page.shutdown()
        page.server_close()


# -- the trainer adapters' dataset builders and constructors ---------------------------------------------------
def _verl(**arguments: Any) -> Any:
    from rl_llm.integrations.verl import verl_rows

    return verl_rows(TTT, **{"seeds": [0], **arguments})


def _trl(**arguments: Any) -> Any:
    from rl_llm.integrations.generic import EnvFactory
    from rl_llm.integrations.trl import make_trl_dataset

    return make_trl_dataset(EnvFactory(TTT), **{"seeds": [0], **arguments})


def _tools(**arguments: Any) -> Any:
    from rl_llm.integrations.trl_env import make_tool_dataset

    return make_tool_dataset(**{"seeds": [0], **arguments})


BAD_ADAPTER_ARGUMENTS = [
    (_verl, {"env_kwargs": ["opponent"]}, "env_kwargs must be a dict"), (_verl, {"options": [1]}, "options must be a dict"),
    (_verl, {"seeds": [NAN]}, r"seeds\[0\] must be an integer"), (_verl, {"seeds": [0, True]}, r"seeds\[1\] must be"),
    (_trl, {"seeds": [2.7]}, r"seeds\[0\] must be an integer"), (_trl, {"options": "x"}, "options must be a dict"),
    (_tools, {"seeds": [-1]}, r"seeds\[0\] must be an integer >= 0"), (_tools, {"options": [1]}, "options must be"),
]  # fmt: skip


@pytest.mark.parametrize(("build", "arguments", "message"), BAD_ADAPTER_ARGUMENTS)
def test_dataset_builders_refuse_bad_seeds_and_mappings_naming_them(build: Any, arguments: dict[str, Any], message: str) -> None:
    """``int(seed)`` made 2.7 seed 2 and True seed 1; ``dict(options)`` failed as "dictionary update sequence"."""
    with pytest.raises(ValueError, match=f"^{message}"):
        build(**arguments)


def test_dataset_builders_take_numpy_seeds_and_mappings() -> None:
    import numpy as np

    rows = _verl(seeds=np.arange(2), env_kwargs={"opponent": "minimax"})
    assert [row["extra_info"]["index"] for row in rows] == [0, 1] and len(_trl(seeds=[np.int64(3)])) == 1


@pytest.mark.parametrize("bad", [0, -1, NAN, True, 64.0])
def test_env_rollout_refuses_a_bad_max_new_tokens(bad: Any) -> None:
    from rl_llm.integrations.generic import EnvFactory
    from rl_llm.integrations.trl import EnvRollout

    with pytest.raises(ValueError, match=r"^max_new_tokens must be an integer"):
        EnvRollout(EnvFactory(TTT), max_new_tokens=bad)


@pytest.mark.parametrize("bad", [NAN, 1.5, -1, True])
def test_a_social_seat_refuses_a_bad_opponent_seed(bad: Any) -> None:
    from rl_llm.integrations.social_seat import make_env

    with pytest.raises(ValueError, match=r"^opponent_seed must be an integer"):
        make_env("social/prisoners_dilemma_v0", opponent="random", opponent_seed=bad)
