"""Family ``permissions``: file modes (executables, private files, symbolic modes, world-writable files)."""

from __future__ import annotations

import random

from rl_llm.envs.terminal.families.common import WHERE, Draft, q, stems, text_lines

SCRIPT = "#!/bin/sh\necho {name}\n"


def _mode_setup(modes: dict[str, int]) -> str:
    """Setup lines giving each path its initial mode (directories included)."""
    return "".join(f"chmod {mode:o} {q(path)}\n" for path, mode in modes.items())


def _mode_checks(modes: dict[str, int]) -> list[dict]:
    return [{"kind": "file_mode", "path": path, "mode": mode} for path, mode in modes.items()]


def symbolic(mode: int) -> str:
    """``0o754`` -> ``rwxr-xr--``."""
    return "".join(flag if mode & (1 << (8 - i)) else "-" for i, flag in enumerate("rwxrwxrwx"))


def executable_scripts(rng: random.Random, difficulty: int) -> Draft:
    names = stems(rng, 4 + 2 * difficulty, difficulty)
    files: dict[str, str | bytes] = {}
    initial, final = {}, {}
    for index, stem in enumerate(names):
        folder = "scripts/lib" if difficulty >= 2 and index % 3 == 2 else "scripts"
        is_script = index % 2 == 0
        path = f"{folder}/{stem}.{'sh' if is_script else rng.choice(('txt', 'conf', 'md'))}"
        files[path] = SCRIPT.format(name=stem) if is_script else text_lines(rng, 2)
        initial[path] = rng.choice((0o644, 0o600, 0o664)) if is_script else rng.choice((0o644, 0o755, 0o666))
        final[path] = 0o755 if is_script else 0o644
    return Draft(
        description=(
            "Under `scripts/` (at any depth), give every file whose name ends in `.sh` the mode 755 "
            f"(`{symbolic(0o755)}`) and every other file the mode 644 (`{symbolic(0o644)}`). {WHERE}"
        ),
        files=files,
        setup=_mode_setup(initial),
        checks=_mode_checks(final) + [{"kind": "file_text", "path": p, "expected": c, "mode": "exact"} for p, c in files.items()],
        solution=[
            "find scripts -type f -name '*.sh' -exec chmod 755 {} + && "
            "find scripts -type f ! -name '*.sh' -exec chmod 644 {} +"
        ],
    )


def private_directory(rng: random.Random, difficulty: int) -> Draft:
    names = stems(rng, 2 + 2 * difficulty, difficulty)
    files = {f"secrets/{stem}.key": text_lines(rng, 1) for stem in names}
    initial: dict[str, int] = {"secrets": 0o755, **{p: rng.choice((0o644, 0o664, 0o666)) for p in files}}
    final: dict[str, int] = {"secrets": 0o700, **{p: 0o600 for p in files}}
    if difficulty >= 2:  # a nested directory too
        files["secrets/old/archive.key"] = text_lines(rng, 1)
        initial.update({"secrets/old": 0o775, "secrets/old/archive.key": 0o644})
        final.update({"secrets/old": 0o700, "secrets/old/archive.key": 0o600})
    return Draft(
        description=(
            "Lock down `secrets/`: every directory in it (itself included) must have the mode 700 and every "
            f"file in it (at any depth) the mode 600, so that only the owner can access them. {WHERE}"
        ),
        files=files,
        setup=_mode_setup(initial),
        checks=_mode_checks(final),
        solution=["find secrets -type d -exec chmod 700 {} + && find secrets -type f -exec chmod 600 {} +"],
    )


def exact_modes(rng: random.Random, difficulty: int) -> Draft:
    names = stems(rng, 2 + difficulty, min(difficulty, 2))
    files = {f"deploy/{stem}.{rng.choice(('sh', 'env', 'pem', 'txt'))}": text_lines(rng, 1) for stem in names}
    choices = (0o400, 0o440, 0o600, 0o640, 0o644, 0o700, 0o750, 0o755, 0o711, 0o604)
    initial = {path: 0o666 for path in files}
    final = {path: rng.choice(choices) for path in files}
    shown = (lambda m: f"`{symbolic(m)}`") if difficulty >= 2 else (lambda m: f"{m:o}")
    listing = "; ".join(f"`{path}` -> {shown(mode)}" for path, mode in final.items())
    return Draft(
        description=(
            f"Set these permissions exactly ({'as `ls -l` shows them' if difficulty >= 2 else 'octal modes'}): "
            f"{listing}. {WHERE}"
        ),
        files=files,
        setup=_mode_setup(initial),
        checks=_mode_checks(final),
        solution=[" && ".join(f"chmod {mode:o} {q(path)}" for path, mode in final.items())],
    )


def world_writable(rng: random.Random, difficulty: int) -> Draft:
    names = stems(rng, 5 + 2 * difficulty, difficulty)
    files = {f"shared/{stem}.dat": text_lines(rng, 1) for stem in names}
    pool = (0o666, 0o777, 0o662, 0o646, 0o644, 0o755, 0o640, 0o600, 0o664)
    initial = {path: rng.choice(pool) for path in files}
    first = next(iter(files))
    initial[first] |= 0o002  # at least one offender
    final = {path: mode & ~0o002 for path, mode in initial.items()}
    return Draft(
        description=(
            "Some files in `shared/` are writable by everyone. Remove the write permission for others from "
            f"each of those files, leaving every other permission bit (and every other file) as it is. {WHERE}"
        ),
        files=files,
        setup=_mode_setup(initial),
        checks=_mode_checks(final),
        solution=["find shared -type f -perm -o+w -exec chmod o-w {} +"],
    )


VARIANTS = {
    "executable_scripts": executable_scripts,
    "private_directory": private_directory,
    "exact_modes": exact_modes,
    "world_writable": world_writable,
}
