"""Talking to ``workspace_checker.py`` inside the sandbox: build its program text, read back its verdict."""

from __future__ import annotations

import ast
import hashlib
import hmac
import secrets
from pathlib import Path
from typing import Any

RUNNER_SOURCE = (Path(__file__).with_name("workspace_checker.py")).read_text(encoding="utf-8")
RESULT_MARK = "RLLM-RESULT"
#: Runs the program from stdin in isolated mode: no PYTHON* variables, no site-packages and no current
#: directory on sys.path, so files the agent left in the workspace cannot shadow a module.
RUNNER_COMMAND = ["python3", "-I", "-S", "-"]


def runner_program(payload: dict[str, Any]) -> tuple[str, str]:
    """(program text for ``python3 -I -S -``, the key its verdict line is signed with).

    The payload goes in as a Python literal (JSON-like values only), so the runner needs no json import.
    The key is never printed: the verdict line carries an HMAC of its own text under it. A program a check
    runs (the agent's) can read the run's stdout pipe through ``/proc/1/fd/1`` (the sandbox's PID 1 shell
    holds it), so a line carrying a plain nonce could be read there and sent back with the verdict flipped.
    """
    key = secrets.token_hex(16)
    return f"{RUNNER_SOURCE}\n_main({dict(payload, key=key)!r})\n", key


def verdict_tag(key: str, flag: str, message: str) -> str:
    """The HMAC the runner puts on ``RLLM-RESULT <tag> <flag> <message>`` (``workspace_checker._main``)."""
    return hmac.new(bytes.fromhex(key), f"{flag} {message}".encode(), hashlib.sha256).hexdigest()


def parse_verdict(stdout: str, key: str) -> tuple[bool, str] | None:
    """The runner's (passed, message) from the last verdict line signed with ``key``; None when none is."""
    for line in reversed(stdout.split("\n")):
        if not line.startswith(f"{RESULT_MARK} "):
            continue
        _, tag, flag, message = [*line.split(" ", 3), "", "", ""][:4]
        if not hmac.compare_digest(tag.encode(), verdict_tag(key, flag, message).encode()):
            continue  # forged, or cut short: not the runner's
        try:
            text = ast.literal_eval(message)
        except (ValueError, SyntaxError):
            return None
        if flag not in ("0", "1") or not isinstance(text, str):
            return None
        return flag == "1", text
    return None
