"""Checkpoints for exact resume: model, optimizers, every RNG, step and data position.

Layout under ``<run>/checkpoints/``: one directory per saved step (``step_000012/``) and a ``latest`` file
naming the newest complete one. A checkpoint is written into a temporary directory, flushed to disk and
renamed into place, and only then does ``latest`` move (itself replaced atomically), so a process killed at
any moment leaves the previous checkpoint intact and never a half-written one behind ``latest``.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl_llm.errors import RLLMError
from rl_llm.paths import atomic_path

LATEST = "latest"


class CheckpointError(RLLMError, RuntimeError):
    """A checkpoint that cannot be read or does not fit this run, with what to do about it."""


def rng_state(generator: torch.Generator | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    if generator is not None:
        state["generator"] = generator.get_state()
    return state


def restore_rng_state(state: dict[str, Any], generator: torch.Generator | None = None) -> None:
    """Undo ``rng_state`` (RNG states are CPU byte tensors, whatever device the checkpoint was mapped to)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if state.get("cuda") and torch.cuda.is_available():
        # One state per GPU of the saving machine: restore those this one has (a checkpoint from a machine with
        # more GPUs must not fail on the missing ones; one saved without CUDA has none and leaves them seeded).
        for index, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state.cpu(), index)
    if generator is not None and "generator" in state:
        generator.set_state(state["generator"].cpu())


def _fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_path(path) as temporary, temporary.open("w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def save_atomic(tensors: Any, path: Path) -> None:
    """``torch.save`` to ``path`` whole or not at all (a temporary file renamed into place)."""
    with atomic_path(path) as temporary:
        torch.save(tensors, temporary)


class Checkpointer:
    def __init__(self, root: str | Path, keep: int = 2) -> None:
        self.root = Path(root)
        self.keep = max(1, keep)

    def save(self, step: int, tensors: dict[str, Any], state: dict[str, Any]) -> Path:
        """Write ``tensors`` (name -> object for ``torch.save``) and ``state`` (JSON) as step ``step``."""
        self.root.mkdir(parents=True, exist_ok=True)
        name = f"step_{step:06d}"
        final = self.root / name
        staging = self.root / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        for key, value in tensors.items():
            torch.save(value, staging / f"{key}.pt")
        (staging / "state.json").write_text(json.dumps({**state, "step": step}, indent=2, default=str))
        _fsync_tree(staging)
        if final.exists():  # re-saving a step after a resume: replace it
            shutil.rmtree(final)
        staging.rename(final)
        write_text_atomic(self.root / LATEST, name)
        self._prune(keep_name=name)
        return final

    def latest(self) -> Path | None:
        """The checkpoint ``latest`` names; where that file is lost or names a missing directory, the newest
        ``step_*`` directory (each is whole: renamed into place only once written). Returning None there would
        start the run over and cut its metrics.jsonl back to step 0."""
        try:
            path: Path | None = self.root / (self.root / LATEST).read_text(encoding="utf-8").strip()
        except OSError:
            path = None
        if path is not None and (path / "state.json").exists():
            return path
        complete = sorted(p for p in self.root.glob("step_*") if (p / "state.json").exists())
        return complete[-1] if complete else None

    def load(self, path: Path | None = None, map_location: str | torch.device = "cpu") -> tuple[dict[str, Any], dict[str, Any]]:
        """(tensors, state) of ``path`` or of the latest checkpoint."""
        path = path or self.latest()
        if path is None:
            raise FileNotFoundError(f"no checkpoint under {self.root}")
        try:
            state = json.loads((path / "state.json").read_text(encoding="utf-8"))
            tensors = {
                file.stem: torch.load(file, map_location=map_location, weights_only=False)
                for file in sorted(path.glob("*.pt"))
            }
        except (OSError, ValueError, RuntimeError, EOFError, pickle.UnpicklingError) as error:
            # e.g. a file truncated or edited after saving: say which, and how to go on, in one line
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise CheckpointError(f"checkpoint {path} cannot be read ({reason}); delete that directory to resume "
                                  "from the previous checkpoint, or train into a new --out") from error
        return tensors, state

    def _prune(self, keep_name: str) -> None:
        complete = sorted(p for p in self.root.glob("step_*") if p.is_dir())
        for stale in complete[: -self.keep]:
            if stale.name != keep_name:
                shutil.rmtree(stale, ignore_errors=True)
        for leftover in self.root.glob(".step_*.tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)
