"""Where rl-llm keeps what it builds once and reuses (the tiny model, BM25 indexes, the generated KB), and
how such files are written: atomically, so a reader never sees half of one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def cache_dir() -> Path:
    """``$RL_LLM_CACHE``, else ``$XDG_CACHE_HOME/rl-llm`` (``~/.cache/rl-llm``)."""
    if os.environ.get("RL_LLM_CACHE"):
        return Path(os.environ["RL_LLM_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rl-llm"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Write ``path`` atomically: yields a new empty temporary file next to it (``.<name>.<random>.partial``,
    mode 0600; the parent directories are created), renamed over ``path`` when the block ends and removed
    when it raises. Readers see the old file or the whole new one. The name comes from ``tempfile.mkstemp``,
    so writers in other processes or threads never share it; when several write the same ``path``, the last
    rename wins."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    os.close(descriptor)
    partial = Path(name)
    try:
        yield partial
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
