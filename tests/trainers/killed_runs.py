"""Start ``rl-llm train`` in a subprocess and SIGKILL it mid-run: the setup of the resume tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl_llm.trainers.logging import read_metrics

REPO = Path(__file__).resolve().parents[2]


def train_command(run_dir: Path, overrides: list[str]) -> list[str]:
    """The ``rl-llm train`` command line; ``[4:-2]`` of it is the overrides alone (for ``train_main``)."""
    return [sys.executable, "-m", "rl_llm.cli", "train", *overrides, "--out", str(run_dir)]


def kill_after_logged_steps(command: list[str], metrics: Path, steps: int, timeout_s: float = 300) -> None:
    """Run ``command`` until ``metrics`` holds ``steps`` logged steps, then SIGKILL it (no clean-up runs)."""
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while len(read_metrics(metrics)) < steps:
        if process.poll() is not None:
            pytest.fail(f"training exited early: {process.stderr.read().decode()[-2000:]}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"training did not log {steps} steps within {timeout_s:.0f} s")
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
