"""The environment of the ``rl-llm`` processes the tests start: none of the test run's own settings (terminal
width, config under HOME...), except the interpreter's import path: packages installed with ``pip install
--target`` and found through ``PYTHONPATH`` (how a bare GPU machine gets what its image lacks,
benchmarks/gpu_check.py) must be found by the child too, or it fails on an import the test is not about."""

from __future__ import annotations

import os


def cli_env(**variables: str) -> dict[str, str]:
    """``PATH=/usr/bin:/bin``, the caller's ``PYTHONPATH`` if set, and ``variables``."""
    inherited = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    return {"PATH": "/usr/bin:/bin", **inherited, **variables}
