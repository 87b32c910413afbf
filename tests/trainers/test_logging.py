"""Metrics logging across a kill and resume."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from rl_llm.trainers.logging import MetricsWriter


def test_a_resumed_runs_event_file_sorts_after_the_killed_runs(tmp_path: Path) -> None:
    # Regression: a resumed run starting in the same second as the killed run's event file, with a pid that
    # sorts lower, had its file read first, and the old file's purge marker then wiped the resumed steps.
    directory = tmp_path / "tensorboard"
    directory.mkdir()
    # The killed run's file: this host, a pid that sorts after ours, and the next second (so the test does
    # not depend on where in the current second it starts).
    killed = directory / f"events.out.tfevents.{int(time.time()) + 1}.{socket.gethostname()}.{os.getpid()}9.0"
    killed.write_bytes(b"")
    writer = MetricsWriter(tmp_path, resume_step=2)
    writer.log(3, {"reward/mean": 1.0})
    writer.close()
    files = sorted(p.name for p in directory.glob("events.out.tfevents.*"))
    assert files[0] == killed.name and len(files) == 2
