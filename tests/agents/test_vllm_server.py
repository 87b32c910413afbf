"""Real vLLM servers, real clients: ``rl-llm eval`` plays every registered single-agent environment to the end.

One session server of the tiny model (``vllm_server`` in tests/conftest.py) answers both clients: ``openai:``
(chat completions, text in and out) and ``vllm:URL#MODEL`` (``/v1/completions`` with token ids). Then
``vllm-serve:`` starts a server of its own and stops it. The tiny model plays badly; what is checked is that
every episode finishes without an error and the run leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rl_llm.cli import main
from rl_llm.envs.registration import env_ids

# Short episodes: what is tested is the client/server round trip on each env's protocol, not the play (the
# bandits' 50 turns would not fit the session server's 4096-token context with the tiny model's tokenizer).
ENV_ARGS: dict[str, list[str]] = {
    "rl-llm/MultiArmedBandit-v0": ["-k", "horizon=6"],
    "rl-llm/ContextualBandit-v0": ["-k", "horizon=6"],
    "rl-llm/Terminal-v0": ["-k", "max_turns=3", "-k", "command_timeout_s=5.0", "-k", "difficulty=1"],
}


def sandbox_problem() -> str | None:
    from rl_llm.sandboxes.factory import resolve_backend

    try:
        resolve_backend("auto")
    except Exception as error:  # SandboxUnavailable: no docker engine and no bubblewrap here
        return str(error)
    return None


def play(env_id: str, agent: str, out: Path, episodes: int = 1, env_args: list[str] | None = None) -> list[dict[str, Any]]:
    if env_id == "rl-llm/Terminal-v0" and (problem := sandbox_problem()) is not None:
        pytest.skip(f"Terminal-v0 needs a sandbox (docker or bubblewrap): {problem}")
    env_args = ENV_ARGS.get(env_id, []) if env_args is None else env_args
    argv = ["eval", env_id, "--agent", agent, "--episodes", str(episodes), "--max-new-tokens", "12",
            "--out", str(out), *env_args]  # fmt: skip
    assert main(argv) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == episodes
    return records


def assert_finished(records: list[dict[str, Any]]) -> None:
    for record in records:
        assert record["error"] is None, record["error"]
        assert record["terminated"] or record["truncated"]
        assert record["turns"] >= 1


@pytest.mark.parametrize("env_id", env_ids())
def test_openai_client_plays_every_env_against_a_real_vllm_server(vllm_server: Any, env_id: str,
                                                                   tmp_path: Path) -> None:  # fmt: skip
    records = play(env_id, f"openai:{vllm_server.url}/v1#{vllm_server.model}", tmp_path / "openai.jsonl")
    assert_finished(records)


@pytest.mark.parametrize("env_id", env_ids())
def test_vllm_client_plays_every_env_against_a_real_vllm_server(vllm_server: Any, env_id: str,
                                                                 tmp_path: Path) -> None:  # fmt: skip
    records = play(env_id, f"vllm:{vllm_server.url}#{vllm_server.model}", tmp_path / "vllm.jsonl")
    assert_finished(records)
    # token-in, token-out: the trajectories file carries the server's token ids and log-probs
    trajectories = [json.loads(line) for line in (tmp_path / "vllm.trajectories.jsonl").read_text().splitlines()]
    assert trajectories and all(json.dumps(t).count("logprob") for t in trajectories)


def test_an_episode_longer_than_the_servers_context_ends_truncated(vllm_server: Any, tmp_path: Path) -> None:
    # The token client reads the served context window (/v1/models) and ends the episode there, not on an error.
    from rl_llm.agents.vllm_server import VLLMServerPolicy

    assert VLLMServerPolicy(vllm_server.url, vllm_server.model).max_context_tokens == 4096
    (record,) = play("rl-llm/MultiArmedBandit-v0", f"vllm:{vllm_server.url}#{vllm_server.model}",
                     tmp_path / "long.jsonl", env_args=["-k", "horizon=200"])  # fmt: skip
    assert record["error"] is None and record["truncated"] and not record["terminated"]
    assert 1 < record["turns"] < 200


def test_openai_client_says_when_the_prompt_no_longer_fits(vllm_server: Any) -> None:
    from rl_llm.agents.http_client import ContextLengthExceeded
    from rl_llm.agents.llm import GenerationRequest
    from rl_llm.agents.openai_backend import OpenAIPolicy
    from rl_llm.types import Message

    policy = OpenAIPolicy(f"{vllm_server.url}/v1", vllm_server.model, max_retries=0)
    request = GenerationRequest(messages=[Message("user", "pull arm 1 " * 3000)], max_new_tokens=4)
    try:
        with pytest.raises(ContextLengthExceeded, match="context window"):
            policy.generate([request])
    finally:
        policy.close()


def test_vllm_serve_starts_a_server_plays_and_stops_it(vllm_server: Any, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # `vllm_server` only says vLLM is here (its server is not used); the server log lands in the cwd.
    import psutil

    monkeypatch.chdir(tmp_path)
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    records = play("rl-llm/TicTacToe-v0", "vllm-serve:tiny", tmp_path / "serve.jsonl", episodes=2)
    assert_finished(records)
    (log,) = tmp_path.glob("vllm-server-*.log")
    assert "Application startup complete" in log.read_text()
    left = {child.pid for child in psutil.Process().children(recursive=True) if child.is_running()} - before
    assert not left, f"the server's processes outlived the eval: {left}"


def test_the_server_module_is_the_one_the_installed_vllm_has(monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM 0.29 moved the server to `launchers.api_server.entry` (`openai.api_server` became a deprecated
    # alias); 0.25-0.28 have the old module only. The server command uses whichever is there, newest first.
    import importlib.util

    from rl_llm.agents.vllm_server import SERVER_MODULES, server_module

    found = server_module()
    assert found in SERVER_MODULES
    if importlib.util.find_spec("vllm") is not None:
        assert importlib.util.find_spec(found) is not None
    real = importlib.util.find_spec

    def before_0_29(name: str, *args: Any) -> Any:
        if name.startswith("vllm.entrypoints.launchers"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", before_0_29)
    assert server_module() == "vllm.entrypoints.openai.api_server"


def test_the_server_is_told_its_worker_extension(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An agent never imports the trainer: the launcher loads the worker extension it is given (a trainer gives
    its weight receiver) and opens the dev-mode route its methods are called through. No process starts here."""
    from rl_llm.agents import vllm_server
    from rl_llm.agents.vllm_backend import vllm_import_error
    from rl_llm.trainers.server_sync import WEIGHT_RECEIVER

    if vllm_import_error() is not None:
        pytest.skip(f"needs vLLM (CPU or GPU build): {vllm_import_error()}")
    started: list[tuple[list[str], dict[str, str]]] = []

    class Exited:  # stands in for the server process
        returncode = 0
        pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process (group) has it: close signals none

        def __init__(self, command: list[str], env: dict[str, str], **_: Any) -> None:
            started.append((command, env))

        def poll(self) -> int:
            return 0

    # This module's Popen only (vLLM's import runs subprocesses of its own).
    monkeypatch.setattr(vllm_server, "subprocess", SimpleNamespace(Popen=Exited, STDOUT=-2))
    monkeypatch.setattr(vllm_server.VLLMServer, "_wait_until_healthy", lambda self, timeout_s: None)
    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)

    def launch(**options: Any) -> tuple[list[str], dict[str, str]]:
        vllm_server.VLLMServer("model-dir", port=8123, log_path=tmp_path / "server.log", **options).close()
        return started[-1]

    command, env = launch()
    assert "--worker-extension-cls" not in command and "VLLM_SERVER_DEV_MODE" not in env
    command, env = launch(worker_extension=WEIGHT_RECEIVER)
    assert command[command.index("--worker-extension-cls") + 1] == WEIGHT_RECEIVER and env["VLLM_SERVER_DEV_MODE"] == "1"
    with pytest.warns(DeprecationWarning, match="worker_extension"):
        old_command, old_env = launch(weight_sync=True)  # the old spelling: the trainer's receiver
    assert (old_command[1:], old_env["VLLM_SERVER_DEV_MODE"]) == (command[1:], "1")


def test_stopping_a_server_waits_until_every_process_of_its_group_is_gone() -> None:
    """A killed engine process holds its memory until the kernel has torn it down; a restarted server must not
    start before that, so ``close`` returns only once no live process of the server's group is left."""
    import subprocess
    import sys

    from rl_llm.agents import vllm_server

    # A "server" that starts a child which ignores SIGTERM, as an engine core busy in C code would not stop.
    script = ("import signal, subprocess, sys, time; "
              "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
              "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)']); time.sleep(60)")  # fmt: skip
    process = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        for _ in range(100):  # the child has started
            if len(vllm_server._group_members(process.pid)) == 2:
                break
            time.sleep(0.05)
        assert len(vllm_server._group_members(process.pid)) == 2
        server = SimpleNamespace(process=process, _log=open(os.devnull, "w"))  # noqa: SIM115  (closed by close)
        vllm_server.VLLMServer.close(server)  # type: ignore[arg-type]
        assert vllm_server._group_members(process.pid) == []
    finally:
        vllm_server._signal_group(process.pid, 9)
