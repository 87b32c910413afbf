"""``TerminalTask``: one shell task, and the loaders for hand-written task directories.

A task directory holds ``description.md`` (or ``task.md``), an optional ``setup.sh`` (run in the fresh
workspace before the episode), a completion test ``test.sh`` (passes on exit status 0) or
``test_final_state.py`` (pytest-style ``test_*`` functions) and optionally ``solution.sh`` (what the oracle
agent runs). The test never enters the workspace: it is sent to the checker after the episode.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DESCRIPTION_FILES = ("description.md", "task.md", "description.txt")
TEST_FILES = {"test.sh": "bash_test", "test_final_state.py": "python_tests"}


@dataclass(frozen=True)
class TerminalTask:
    """A shell task: what the agent reads, how the workspace starts, and how the end state is judged.

    ``files`` are written into the empty workspace (str for text, bytes for binary), then ``setup`` runs
    there with bash. ``checks`` are declarative specs run by the checker (``workspace_checker.py``) on the final
    state; all must pass for reward 1. ``solution`` is the oracle's list of shell commands.
    """

    task_id: str
    family: str
    difficulty: int
    description: str
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    setup: str = ""
    checks: tuple[Mapping[str, Any], ...] = ()
    solution: tuple[str, ...] = ()
    variant: str = ""

    def __post_init__(self) -> None:
        if not self.description.strip():
            raise ValueError(f"task {self.task_id!r} has an empty description")
        if not self.checks:
            raise ValueError(f"task {self.task_id!r} has no completion check")
        for rel in self.files:
            parts = Path(rel).parts
            if not parts or Path(rel).is_absolute() or ".." in parts:
                raise ValueError(f"task {self.task_id!r}: file path {rel!r} must stay inside the workspace")

    def setup_payload(self) -> dict[str, Any]:
        files = {
            rel: {"b64": base64.b64encode(content).decode()} if isinstance(content, bytes) else {"text": content}
            for rel, content in self.files.items()
        }
        return {"mode": "setup", "files": files, "script": self.setup}


def read_task_text(path: Path) -> str:
    """A task file's text, or a ValueError naming the file: a task folder is input from outside, and a file
    that is not UTF-8 was a bare ``UnicodeDecodeError`` naming no file."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None


def resolved_link(path: Path) -> Path:
    """``path.resolve()``, or a ValueError naming a symlink loop (``a -> b -> a``), which was a bare
    ``RuntimeError`` (an ``OSError`` on newer Pythons) from inside the task loader."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as error:
        raise ValueError(f"{path}: a symlink that cannot be followed ({error})") from None


def check_links_stay_inside(root: Path) -> None:
    """Refuse a task folder holding a symlink that leads outside it. A task folder is input from outside (a
    downloaded dataset, a git clone), and its files are read on the host: ``environment/notes -> ~/.ssh/id_rsa``
    copied a host file into the agent's workspace, and a linked test or setup script read one into the check.
    Links within the folder are fine."""
    inside = root.resolve()
    for path in root.rglob("*"):  # symlinked directories are listed, not entered
        if path.is_symlink() and not resolved_link(path).is_relative_to(inside):
            raise ValueError(f"task folder {root}: {path.relative_to(root)} is a symlink that leads outside the "
                             "folder; copy the file in instead")  # fmt: skip


def load_task_dir(path: str | Path, family: str = "custom") -> TerminalTask:
    """A ``TerminalTask`` from a hand-written task directory (see the module docstring)."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"task directory {root} does not exist")
    # Harbor / Terminal-Bench task folders have their own loader.
    from rl_llm.envs.terminal.harbor import is_harbor_task_dir, load_harbor_task

    if is_harbor_task_dir(root):
        return load_harbor_task(root, family)  # which checks the links itself
    description = next((root / name for name in DESCRIPTION_FILES if (root / name).is_file()), None)
    if description is None:
        raise FileNotFoundError(f"task directory {root} has none of {', '.join(DESCRIPTION_FILES)}")
    tests = [(root / name, kind) for name, kind in TEST_FILES.items() if (root / name).is_file()]
    if not tests:
        raise FileNotFoundError(f"task directory {root} has no completion test ({' or '.join(TEST_FILES)})")
    check_links_stay_inside(root)  # only now: a folder that is no task (say "/") is not walked at all
    setup = root / "setup.sh"
    solution = root / "solution.sh"
    checks = tuple({"kind": kind, "source": read_task_text(test)} for test, kind in tests)
    text = read_task_text(description)
    digest = hashlib.sha1(repr((text, [c["source"] for c in checks])).encode()).hexdigest()[:10]
    return TerminalTask(
        task_id=f"terminal/{family}/{root.name}/{digest}",
        family=family,
        difficulty=0,
        description=text.strip(),
        setup=read_task_text(setup) if setup.is_file() else "",
        checks=checks,
        solution=(read_task_text(solution),) if solution.is_file() else (),
        variant=root.name,
    )


def is_task_dir(path: Path) -> bool:
    """Whether ``path`` is a task directory: hand-written (it holds one of ``DESCRIPTION_FILES``) or Harbor."""
    from rl_llm.envs.terminal.harbor import is_harbor_task_dir

    return any((path / name).is_file() for name in DESCRIPTION_FILES) or is_harbor_task_dir(path)


def load_task_folder(path: str | Path, family: str = "custom") -> list[TerminalTask]:
    """Every task directory directly inside ``path``, sorted by name."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"task folder {root} does not exist")
    tasks = [
        load_task_dir(child, family)
        for child in sorted(root.iterdir())
        if child.is_dir() and is_task_dir(child)
    ]
    if not tasks:
        raise FileNotFoundError(f"task folder {root} holds no task directories")
    return tasks
