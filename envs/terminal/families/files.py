"""Family ``files``: moving, deleting, finding and renaming files in a directory tree."""

from __future__ import annotations

import random

from rl_llm.envs.terminal.families.common import WHERE, WORDS, Draft, q, stems, text_lines

OTHER_EXTENSIONS = ("txt", "py", "ini", "html", "png", "sh", "xml", "yaml")


def _tree(rng: random.Random, root: str, difficulty: int) -> list[str]:
    """Directories under ``root``, nested up to ``difficulty`` levels."""
    dirs = [root]
    for _ in range(1 + 2 * difficulty):
        parent = rng.choice(dirs)
        if parent.count("/") - root.count("/") < difficulty:
            child = f"{parent}/{rng.choice(WORDS)}"
            if child not in dirs:
                dirs.append(child)
    return dirs


def _content(rng: random.Random, path: str) -> str:
    return f"# {path.rsplit('/', 1)[-1]}\n" + text_lines(rng, rng.randint(1, 4))


def move_by_extension(rng: random.Random, difficulty: int) -> Draft:
    ext = rng.choice(("log", "csv", "md", "json", "cfg"))
    dirs = _tree(rng, "project", difficulty)
    names = stems(rng, 5 + 3 * difficulty, difficulty)
    moved, kept = names[: rng.randint(2, 2 + difficulty)], names[2 + difficulty :]
    files: dict[str, str | bytes] = {}
    for stem in moved:
        path = f"{rng.choice(dirs)}/{stem}.{ext}"
        files[path] = _content(rng, path)
    for stem in kept:
        path = f"{rng.choice(dirs)}/{stem}.{rng.choice(OTHER_EXTENSIONS)}"
        files[path] = _content(rng, path)
    collected = {p.rsplit("/", 1)[1]: c for p, c in files.items() if p.endswith("." + ext)}
    remaining = {p[len("project/") :]: c for p, c in files.items() if not p.endswith("." + ext)}
    return Draft(
        description=(
            f"Move every file with the extension `.{ext}` found anywhere under `project/` (at any depth) into "
            f"a new directory `collected/`, directly (no subdirectories), keeping each file's name and "
            f"content. Leave every other file where it is. {WHERE}"
        ),
        files=files,
        checks=[
            {"kind": "dir_files", "path": "collected", "expected": collected},
            {"kind": "dir_files", "path": "project", "expected": remaining},
        ],
        solution=[f"mkdir -p collected && find project -type f -name '*.{ext}' -exec mv -t collected {{}} +"],
    )


def delete_matching(rng: random.Random, difficulty: int) -> Draft:
    doomed_exts = rng.sample(["tmp", "bak", "swp", "old"], 1 + (difficulty >= 2))
    dirs = _tree(rng, "cache", difficulty)
    names = stems(rng, 6 + 3 * difficulty, difficulty)
    files: dict[str, str | bytes] = {}
    for index, stem in enumerate(names):
        if index < 2 + difficulty:
            name = f"{stem}.{rng.choice(doomed_exts)}"
        elif difficulty >= 2 and index % 3 == 0:
            name = f"{stem}.{rng.choice(doomed_exts)}.txt"  # contains the pattern but does not end with it
        else:
            name = f"{stem}.{rng.choice(OTHER_EXTENSIONS)}"
        path = f"{rng.choice(dirs)}/{name}"
        files[path] = _content(rng, path)
    kept = {p[len("cache/") :]: c for p, c in files.items() if p.rsplit(".", 1)[1] not in doomed_exts}
    patterns = " or ".join(f"`.{ext}`" for ext in doomed_exts)
    finds = " -o ".join(f"-name '*.{ext}'" for ext in doomed_exts)
    return Draft(
        description=(
            f"Clean up `cache/`: delete every file (at any depth) whose name ends with {patterns}. "
            f"Keep all other files unchanged. {WHERE}"
        ),
        files=files,
        checks=[{"kind": "dir_files", "path": "cache", "expected": kept}],
        solution=[f"find cache -type f \\( {finds} \\) -delete"],
    )


def list_large_files(rng: random.Random, difficulty: int) -> Draft:
    threshold = rng.randrange(1000, 5000, 100)
    dirs = _tree(rng, "data", difficulty)
    names = stems(rng, 5 + 3 * difficulty, difficulty)
    files: dict[str, str | bytes] = {}
    for index, stem in enumerate(names):
        big = index < 2 or (index > 3 and rng.random() < 0.5)
        size = rng.randint(threshold + 10, 3 * threshold) if big else rng.randint(10, threshold - 10)
        path = f"{rng.choice(dirs)}/{stem}.{rng.choice(('bin', 'dat', 'txt'))}"
        files[path] = (text_lines(rng, size // 20 + 2) * 2)[:size]
    expected = sorted((p for p, c in files.items() if len(c.encode()) > threshold), key=lambda p: p.encode())
    return Draft(
        description=(
            f"Find every file under `data/` (at any depth) that is larger than {threshold} bytes. Write their "
            f"paths, relative to your home directory (like `data/x/y.dat`), one per line, to `big_files.txt`, "
            f"sorted in plain byte order (the order `LC_ALL=C sort` gives). {WHERE}"
        ),
        files=files,
        checks=[{"kind": "file_text", "path": "big_files.txt", "expected": "\n".join(expected), "mode": "lines"}],
        solution=[f"find data -type f -size +{threshold}c | LC_ALL=C sort > big_files.txt"],
    )


def rename_extension(rng: random.Random, difficulty: int) -> Draft:
    old, new = rng.choice((("txt", "md"), ("jpeg", "jpg"), ("htm", "html"), ("yml", "yaml")))
    names = stems(rng, 4 + 3 * difficulty, difficulty)
    files: dict[str, str | bytes] = {}
    for index, stem in enumerate(names):
        if index < 2 + difficulty:
            path = f"notes/{stem}.{old}"
        elif difficulty >= 2 and index % 2 == 0:
            path = f"notes/archive/{stem}.{old}"  # in a subfolder: must keep its name
        else:
            path = f"notes/{stem}.{rng.choice(OTHER_EXTENSIONS)}"
        files[path] = _content(rng, path)
    expected = {}
    for path, content in files.items():
        rel = path[len("notes/") :]
        if "/" not in rel and rel.endswith("." + old):
            rel = rel[: -len(old)] + new
        expected[rel] = content
    return Draft(
        description=(
            f"Rename every `.{old}` file directly inside `notes/` (not in its subdirectories) so that it ends "
            f"in `.{new}` instead, keeping the rest of the name and the content. {WHERE}"
        ),
        files=files,
        checks=[{"kind": "dir_files", "path": "notes", "expected": expected}],
        solution=[f'for f in notes/*.{old}; do mv -- "$f" "${{f%.{old}}}.{new}"; done'],
    )


def find_by_content(rng: random.Random, difficulty: int) -> Draft:
    ticket = f"{rng.choice(WORDS).upper()}-{rng.randint(1000, 9999)}"
    dirs = _tree(rng, "docs", difficulty)
    names = stems(rng, 4 + 4 * difficulty, difficulty)
    files: dict[str, str | bytes] = {}
    for stem in names:
        path = f"{rng.choice(dirs)}/{stem}.txt"
        files[path] = _content(rng, path)
    target = rng.choice(sorted(files))
    lines = files[target].splitlines(keepends=True)
    lines.insert(rng.randint(1, len(lines)), f"see ticket {ticket} for details\n")
    files[target] = "".join(lines)
    if difficulty >= 2:  # near misses: a longer ticket number and another project's ticket
        decoy = rng.choice([p for p in files if p != target])
        files[decoy] += f"see ticket {ticket}0 and {ticket[::-1]}\n"
    return Draft(
        description=(
            f"Exactly one file under `docs/` mentions the ticket `{ticket}` (as a whole word). Write that "
            f"file's path, relative to your home directory (like `docs/a/b.txt`), to `answer.txt`. {WHERE}"
        ),
        files=files,
        checks=[{"kind": "file_text", "path": "answer.txt", "expected": target, "mode": "stripped"}],
        solution=[f"grep -rlw -- {q(ticket)} docs > answer.txt"],
    )


VARIANTS = {
    "move_by_extension": move_by_extension,
    "delete_matching": delete_matching,
    "list_large_files": list_large_files,
    "rename_extension": rename_extension,
    "find_by_content": find_by_content,
}
