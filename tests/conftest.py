"""Shared test fixtures and hypothesis strategies."""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# CI runs with a fixed, moderate budget; `HYPOTHESIS_PROFILE=thorough` for longer local fuzzing.
settings.register_profile(
    "ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile("thorough", max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# A test run started as a background job (`nohup python -m pytest &`) inherits SIGINT ignored: Python then
# installs no KeyboardInterrupt handler and every shell the sandboxes start ignores interrupts too, which the
# Ctrl-C tests of tests/sandboxes exercise. Interrupts work here as they do in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Tag fragments every env parser meets: complete, unclosed, nested and misspelled tags of all envs.
TAG_FRAGMENTS = [
    f"{prefix}{tag}{suffix}"
    for tag in ("action", "move", "sql", "solution", "search", "answer", "command", "python", "think", "tool_call",
                "message", "propose", "A", "B")
    for prefix, suffix in (("<", ">"), ("</", ">"), ("<", ""), ("<<", ">>"))
]


@st.composite
def hostile_text(draw: st.DrawFn) -> str:
    """Arbitrary LLM turns: Unicode, control characters, tag soup, valid-looking actions and huge strings."""
    kind = draw(st.sampled_from(["unicode", "tags", "mixed", "huge", "empty"]))
    if kind == "empty":
        return draw(st.sampled_from(["", " ", "\n", "\x00", "\r\n\t"]))
    if kind == "unicode":
        return draw(st.text(max_size=200))
    parts = st.one_of(st.sampled_from(TAG_FRAGMENTS), st.text(max_size=12), st.sampled_from(
        ["A", "B2", "2,2", "5", "SELECT 1", "ls", "done", "{\"name\": \"x\"}", "\x1b[31m", "\ufeff", "\ud7ff"]))
    text = "".join(draw(st.lists(parts, max_size=30)))
    if kind == "huge":
        return text * draw(st.integers(100, 3000)) + draw(st.sampled_from(TAG_FRAGMENTS))
    return text


# Environments that cannot even reset without an isolating sandbox. Tests parametrized over `env_id` skip
# them, naming what is missing, on machines without bubblewrap or Docker (see `rl-llm doctor`).
NEEDS_SANDBOX = frozenset({"rl-llm/Terminal-v0"})


@functools.cache
def sandbox_problem() -> str | None:
    """Why no isolating sandbox can start here (with the fix), or None."""
    from rl_llm.sandboxes import SandboxUnavailable, resolve_backend

    try:
        resolve_backend("auto")
    except SandboxUnavailable as error:
        return str(error)
    return None


# Environments that need an optional extra (``pip install 'rl-llm[math]'``): tests that play them skip, naming
# what to install, where it is missing, instead of failing.
NEEDS_MATH_EXTRA = frozenset({"rl-llm/Math-v0"})


def skip_without_math_extra(what: str = "rl-llm/Math-v0") -> None:
    """Skip the running test when reasoning-gym or math-verify cannot be imported (checked only when asked:
    importing them takes seconds)."""
    from rl_llm.envs.math.problems import reasoning_gym_import_error

    if (missing := reasoning_gym_import_error()) is not None:
        pytest.skip(f"{what} needs the math extra: {missing}")


@pytest.fixture
def math_extra() -> None:
    """For tests that play rl-llm/Math-v0 without being parametrized over ``env_id`` (e.g. a suite holding it)."""
    skip_without_math_extra("this test plays rl-llm/Math-v0, which")


@pytest.fixture(autouse=True)
def _skip_envs_this_machine_cannot_run(request: pytest.FixtureRequest) -> None:
    callspec = getattr(request.node, "callspec", None)
    env_id = callspec.params.get("env_id") if callspec is not None else None
    if env_id in NEEDS_SANDBOX and (problem := sandbox_problem()) is not None:
        pytest.skip(f"{env_id} needs an isolating sandbox: {problem}")
    if env_id in NEEDS_MATH_EXTRA:
        skip_without_math_extra(env_id)


# One real vLLM OpenAI-compatible server of the tiny model, shared by every test that needs a real endpoint
# (vLLM backends, `openai:` agents, benchmark suites, verifiers): starting one costs about a minute on CPU.
TINY_SERVER_ARGS = ("--max-model-len", "4096", "--dtype", "float32", "--kv-cache-memory-bytes", str(512 * 2**20),
                    "--seed", "0")  # fmt: skip


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A running ``VLLMServer`` of the tiny model: ``.url`` (http://127.0.0.1:PORT, add ``/v1`` for the
    OpenAI API) and ``.model`` (the served model name, the tiny model's directory). Skips naming what is missing."""
    from rl_llm.agents.vllm_backend import vllm_import_error
    from rl_llm.agents.vllm_server import VLLMServer
    from rl_llm.trainers.server_sync import WEIGHT_RECEIVER

    reason = vllm_import_error()
    if reason is not None:
        pytest.skip(f"needs vLLM (CPU or GPU build): {reason}")
    from rl_llm.agents import tiny_model

    model = str(tiny_model())
    # The weight receiver: the server-mode weight sync test pushes weights into this server (and restores them).
    # VLLM_MAX_STOP_STRINGS: vLLM refuses more than 4 stop strings by default; ToolCalls-v0 sends 5.
    server = VLLMServer(model, extra_args=TINY_SERVER_ARGS, log_path=tmp_path_factory.mktemp("vllm") / "server.log",
                        worker_extension=WEIGHT_RECEIVER, env={"VLLM_MAX_STOP_STRINGS": "16"})  # fmt: skip
    try:
        yield server
    finally:
        server.close()
