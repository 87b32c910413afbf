"""Talking to ``workspace_checker.py`` inside the sandbox: build its program text, read back its verdict."""

from __future__ import annotations

import ast
import secrets
from pathlib import Path
from typing import Any

RUNNER_SOURCE = (Path(__file__).with_name("workspace_checker.py")).read_text(encoding="utf-8")
RESULT_MARK = "RLLM-RESULT"
#: Runs the program from stdin in isolated mode: no PYTHON* variables, no site-packages and no current
#: directory on sys.path, so files the agent left in the workspace cannot shadow a module.
RUNNER_COMMAND = ["python3", "-I", "-S", "-"]


def runner_program(payload: dict[str, Any]) -> tuple[str, str]:
    """(program text for ``python3 -I -S -``, the nonce its verdict line will carry).

    The payload goes in as a Python literal (JSON-like values only), so the runner needs no json import.
    """
    nonce = secrets.token_hex(12)
    return f"{RUNNER_SOURCE}\n_main({dict(payload, nonce=nonce)!r})\n", nonce


def parse_verdict(stdout: str, nonce: str) -> tuple[bool, str] | None:
    """The runner's (passed, message), or None when no line with this nonce came back."""
    prefix = f"{RESULT_MARK} {nonce} "
    position = stdout.rfind(prefix)
    if position < 0:
        return None
    flag, _, message = stdout[position + len(prefix) :].split("\n", 1)[0].partition(" ")
    try:
        text = ast.literal_eval(message)
    except (ValueError, SyntaxError):
        return None
    if flag not in ("0", "1") or not isinstance(text, str):
        return None
    return flag == "1", text
