"""Where rl-llm keeps what it builds once and reuses (the tiny model, BM25 indexes, the generated KB), and
how such files are written: atomically, so a reader never sees half of one."""

from __future__ import annotations

import contextlib
import os
import secrets
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
    the parent directories are created), renamed over ``path`` when the block ends and removed when it
    raises. Readers see the old file or the whole new one. The random name is created exclusively, so writers
    in other processes or threads never share it; when several write the same ``path``, the last rename
    wins. The file gets the mode a plain ``open`` would give (0666 less the umask). An existing ``path`` that
    is no regular file (a device such as /dev/null, a named pipe) is yielded itself: nothing to replace."""
    path = Path(path)
    if path.is_dir():  # the rename would fail at the end, naming the temporary file: say it first, plainly
        raise IsADirectoryError(f"{path} is a directory; name a file to write instead")
    if path.exists() and not path.is_file():
        # /dev/null, /dev/stdout, a named pipe: written in place (run as root, the rename would replace the
        # device node itself with a plain file)
        yield path
        return
    if (parent := next((p for p in path.parents if p.exists()), None)) is not None and not parent.is_dir():
        # mkdir would say only "File exists", naming neither the output nor what is in the way
        raise NotADirectoryError(f"cannot write {path}: {parent} is a file, not a directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{secrets.token_hex(8)}.partial")
    os.close(os.open(partial, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    try:
        yield partial
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
