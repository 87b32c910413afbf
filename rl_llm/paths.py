"""Where rl-llm keeps what it builds once and reuses (the tiny model, BM25 indexes, the generated KB), how
such files are written (atomically, so a reader never sees half of one), how the YAML files people write
are read (``load_yaml``: a repeated key is an error), and which directories are training runs."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml


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
    _make_parent(path)
    partial = path.with_name(f".{path.name}.{secrets.token_hex(8)}.partial")
    os.close(os.open(partial, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    try:
        yield partial
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _make_parent(path: Path) -> None:
    if (parent := next((p for p in path.parents if p.exists()), None)) is not None and not parent.is_dir():
        # mkdir would say only "File exists", naming neither the output nor what is in the way
        raise NotADirectoryError(f"cannot write {path}: {parent} is a file, not a directory")
    path.parent.mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Write the directory ``path`` atomically: yields a new empty temporary directory next to it
    (``.<name>.<random>.partial``), moved to ``path`` when the block ends and removed with what it holds when
    the block raises, so a failed write leaves no half-written directory. An existing ``path`` (a directory)
    is replaced whole once the new one is complete; the caller decides beforehand that it may go."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{path} is a file; name a directory to write instead")
    _make_parent(path)
    partial = path.with_name(f".{path.name}.{secrets.token_hex(8)}.partial")
    partial.mkdir()  # exclusive: a name no other writer shares
    try:
        yield partial
        if path.exists():  # rename cannot replace a non-empty directory: move the old one aside first
            old = path.with_name(f".{path.name}.{secrets.token_hex(8)}.old")
            path.rename(old)
            partial.rename(path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            partial.rename(path)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


# -- YAML people write ---------------------------------------------------------------------------------------
class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping with a repeated key. YAML requires keys to be unique (YAML
    1.2, section 3.2.1.1) but PyYAML keeps the last value silently: a second ``lr:`` further down a config
    would win unseen. Keys merged in with ``<<: *anchor`` may be overridden, as YAML intends."""

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            self._check_keys(node, "", set())
        return node

    def _check_keys(self, node: yaml.Node, path: str, seen: set[int]) -> None:
        if id(node) in seen:  # an alias (maybe of itself): checked once
            return
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self._check_keys(item, f"{path}[{index}]", seen)
        elif isinstance(node, yaml.MappingNode):
            first: dict[Any, yaml.Node] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    self._check_keys(value_node, path, seen)
                    continue
                key = self.construct_object(key_node, deep=True) if isinstance(key_node, yaml.ScalarNode) else None
                dotted = f"{path}.{key}" if path else str(key)
                if key is not None and key in first:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {dotted!r} (first on line {first[key].start_mark.line + 1})",
                        key_node.start_mark)  # fmt: skip
                if key is not None:
                    first[key] = key_node
                self._check_keys(value_node, dotted, seen)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` that raises ``yaml.YAMLError`` for a repeated mapping key (``UniqueKeyLoader``)."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader: plain data only, like safe_load


def yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's message on one line ("line 2, column 1: expected the node content, but found '<stream end>'"):
    its own spans several lines and names the text as "<unicode string>"."""
    mark = getattr(error, "problem_mark", None)
    problem = ": ".join(filter(None, (getattr(error, "context", None), getattr(error, "problem", None))))
    if not problem:
        return " ".join(str(error).split())
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem


# -- run directories -----------------------------------------------------------------------------------------
RUN_CONFIG = "config.yaml"
# The top-level keys of the config.yaml every version of the trainer writes into its run directory (the whole
# TrainConfig, trainers/config.py); a person's own config file names only what it changes.
RUN_CONFIG_KEYS = ("algorithm", "steps", "seed", "out_dir", "env", "model", "rollout", "optim", "loss", "ppo", "otc",
                   "eval", "log")  # fmt: skip


def is_training_run(path: str | os.PathLike[str]) -> bool:
    """``path`` is a directory that ``rl-llm train`` wrote: its config.yaml is a saved TrainConfig."""
    try:
        saved = load_yaml((Path(path) / RUN_CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(saved, dict) and all(key in saved for key in RUN_CONFIG_KEYS)
