"""The python tool of ToolCalls-v0 runs code in an ``rl_llm.sandboxes`` sandbox that it cannot leave:
no host files (read or write), no host network, no host environment or processes, bounded time."""

from __future__ import annotations

import os
import socket

import gymnasium as gym
import pytest

import rl_llm  # noqa: F401
from rl_llm.agents.baselines.search import ToolCallsJsonOracle, ToolCallsOracle
from tests.envs.helpers_search import play_task

sandboxes = pytest.importorskip("rl_llm.sandboxes", reason="rl_llm.sandboxes is not installed")
ISOLATING = [name for name in sandboxes.available_backends() if name in ("bwrap", "docker")]
pytestmark = pytest.mark.skipif(not ISOLATING, reason="no isolating sandbox backend (bwrap or docker) on this machine")


@pytest.fixture(scope="module")
def env():
    env = gym.make("rl-llm/ToolCalls-v0", tools=("python",), python_timeout=2.0, max_turns=30)
    yield env
    env.close()


def run_python(env: gym.Env, code: str) -> str:
    env.reset(seed=0)
    observation, _, terminated, _, info = env.step(f"<python>{code}</python>")
    assert not terminated and info["metrics"]["python_calls"] == 1
    return observation


@pytest.mark.parametrize(("oracle", "every"), [(ToolCallsOracle, 1), (ToolCallsJsonOracle, 4)])
def test_oracles_solve_the_python_tasks(oracle, every) -> None:
    env = gym.make("rl-llm/ToolCalls-v0", kinds=("digit_sum", "prime_count"))
    try:
        for index in range(0, len(env.unwrapped.tasks), every):
            task = env.unwrapped.tasks[index]
            result = play_task(env, oracle(), index)
            assert result["metrics"]["correct"] == 1.0 and result["metrics"]["python_calls"] == 1, task.question
            assert result["metrics"]["tool_calls"] == task.optimal_tool_calls
    finally:
        env.close()


def test_code_output_errors_and_timeouts_come_back_as_text(env) -> None:
    assert "\n42\n" in run_python(env, "print(6 * 7)")
    failed = run_python(env, "raise ValueError('bad input')")
    assert "[exit code 1]" in failed and "ValueError: bad input" in failed
    assert "[timed out after 2 s]" in run_python(env, "while True:\n    pass")
    assert "[no output: print the result]" in run_python(env, "x = 1")
    assert "[not run:" in run_python(env, "print('a\x00b')")


def test_code_cannot_read_or_write_host_files(env, tmp_path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    observation = run_python(env, f"print(open({str(secret)!r}).read())")
    assert "host secret" not in observation and "FileNotFoundError" in observation
    assert "FileNotFoundError" in run_python(env, "print(open('/work/main/pyproject.toml').read())")
    for target in (tmp_path / "escaped.txt", "/work/main/escaped_by_sandbox.txt"):
        run_python(env, f"open({str(target)!r}, 'w').write('out')")
        assert not os.path.exists(target)


def test_code_cannot_reach_the_host_network(env) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    try:
        observation = run_python(env, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('CONNECTED')")
        assert "CONNECTED" not in observation and "Error" in observation
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


def test_code_sees_no_host_environment_or_processes(env, monkeypatch) -> None:
    monkeypatch.setenv("RL_LLM_TEST_SECRET", "do-not-leak")
    assert "do-not-leak" not in run_python(env, "import os; print(dict(os.environ))")
    observation = run_python(env, "import os; print(len([p for p in os.listdir('/proc') if p.isdigit()]))")
    assert int(observation.split("\n")[1]) < 10  # its own pid namespace: only the sandbox's few processes
    assert str(os.getpid()) not in run_python(env, "import os; print(sorted(os.listdir('/proc')))")


def test_files_do_not_survive_into_the_next_episode(env) -> None:
    run_python(env, "open('note.txt', 'w').write('kept?')")
    assert "FileNotFoundError" in run_python(env, "print(open('note.txt').read())")  # reset wiped the workspace


def test_the_envs_output_limit_applies_to_python_too() -> None:
    env = gym.make("rl-llm/ToolCalls-v0", tools=("python",), max_output_chars=5000)
    try:
        observation = run_python(env, "print('x' * 3000)")
    finally:
        env.close()
    assert "x" * 3000 in observation and "truncated" not in observation


def test_long_python_output_is_cut_once_and_says_how_much() -> None:
    env = gym.make("rl-llm/ToolCalls-v0", tools=("python",), max_output_chars=100)
    try:
        observation = run_python(env, "print('x' * 5000)")
    finally:
        env.close()
    assert observation.count("truncated") == 1 and "[... 4901 characters truncated ...]" in observation
