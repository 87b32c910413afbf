"""The procedural task generator: a seed, a family filter and a difficulty give one ``TerminalTask``."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from numbers import Integral

from rl_llm.envs.terminal.families import (
    archives,
    config_files,
    data,
    files,
    git_repos,
    logs,
    permissions,
    scripting,
    sqlite_db,
    text,
)
from rl_llm.envs.terminal.families.common import Draft
from rl_llm.envs.terminal.task import TerminalTask

Variant = Callable[[random.Random, int], Draft]

FAMILIES: dict[str, dict[str, Variant]] = {
    "files": files.VARIANTS,
    "logs": logs.VARIANTS,
    "data": data.VARIANTS,
    "text": text.VARIANTS,
    "scripting": scripting.VARIANTS,
    "permissions": permissions.VARIANTS,
    "archives": archives.VARIANTS,
    "config": config_files.VARIANTS,
    "git": git_repos.VARIANTS,
    "sqlite": sqlite_db.VARIANTS,
}
DIFFICULTIES = (1, 2, 3)


def _as_choices(value: str | int | Sequence | None, allowed: Sequence, what: str) -> list:
    """``value`` (one choice or several) as a list of allowed choices. A choice must be of the allowed type:
    True equals 1 and 2.0 equals 2 to Python, which made difficulty=True a task id with ``dTrue`` in it (two
    ids for one task), and a numpy integer, which is no ``int``, was taken for a sequence and failed."""
    if value is None:
        return list(allowed)
    several = isinstance(value, Iterable) and not isinstance(value, (str, Mapping))
    chosen = list(value) if several else [value]
    unknown = [v for v in chosen if not _is_allowed(v, allowed)]
    if unknown or not chosen:
        raise ValueError(f"unknown {what} {unknown or chosen!r}; choose from {list(allowed)}")
    return [int(v) if isinstance(v, Integral) else v for v in chosen]


def _is_allowed(value: object, allowed: Sequence) -> bool:
    if isinstance(value, str):
        return value in allowed
    return isinstance(value, Integral) and not isinstance(value, bool) and value in allowed


def generate_task(
    seed: int,
    family: str | Sequence[str] | None = None,
    difficulty: int | Sequence[int] | None = None,
    variant: str | None = None,
) -> TerminalTask:
    """The task for ``seed``, drawn from ``family`` (one name, several, or all) at ``difficulty`` (1-3).

    The same arguments always give the same task, down to every byte of the workspace.
    """
    families = _as_choices(family, list(FAMILIES), "task family")
    levels = _as_choices(difficulty, DIFFICULTIES, "difficulty")
    rng = random.Random(seed)
    family_name = rng.choice(families)
    level = rng.choice(levels)
    variants = FAMILIES[family_name]
    name = variant if variant is not None else rng.choice(sorted(variants))
    if name not in variants:
        raise ValueError(f"unknown variant {name!r} of family {family_name!r}; choose from {sorted(variants)}")
    draft = variants[name](rng, level)
    return TerminalTask(
        task_id=f"terminal/{family_name}/{name}/d{level}/{seed}",
        family=family_name,
        difficulty=level,
        description=draft.description,
        files=draft.files,
        setup=draft.setup,
        checks=tuple(draft.checks),
        solution=tuple(draft.solution),
        variant=name,
    )
