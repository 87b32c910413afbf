"""Family ``archives``: creating, extracting and inspecting tar and gzip archives."""

from __future__ import annotations

import gzip
import hashlib
import io
import random
import tarfile

from rl_llm.envs.terminal.families.common import WHERE, WORDS, Draft, stems, text_lines
from rl_llm.envs.terminal.workspace_checker import FIXED_EPOCH


def _tree_files(rng: random.Random, root: str, count: int, difficulty: int, exts: tuple[str, ...]) -> dict[str, str]:
    folders = [root] + [f"{root}/{w}" for w in rng.sample(WORDS, difficulty)]
    return {f"{rng.choice(folders)}/{stem}.{rng.choice(exts)}": text_lines(rng, rng.randint(1, 5))
            for stem in stems(rng, count, difficulty)}


def _tar_bytes(files: dict[str, str], compress: bool) -> bytes:
    """A deterministic tar (fixed mtimes and owners) of ``files``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for name, content in sorted(files.items()):
            data = content.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode, info.uname, info.gname = len(data), FIXED_EPOCH, 0o644, "dev", "dev"
            archive.addfile(info, io.BytesIO(data))
    raw = buffer.getvalue()
    return gzip.compress(raw, mtime=0) if compress else raw


def create_backup(rng: random.Random, difficulty: int) -> Draft:
    site = rng.choice(("site", "webapp", "docs", "project"))
    stamp = f"{rng.randint(2020, 2025)}{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}"
    files = _tree_files(rng, site, 4 + 2 * difficulty, difficulty, ("html", "css", "js", "log", "txt"))
    files[f"{site}/index.html"] = f"<h1>{rng.choice(WORDS)}</h1>\n"
    excluded = difficulty >= 2
    expected = {p: c for p, c in files.items() if not (excluded and p.endswith(".log"))}
    if excluded and len(expected) == len(files):
        files[f"{site}/debug.log"] = text_lines(rng, 2)
    archive = f"backup/{site}-{stamp}.tar.gz"
    exclude = " --exclude='*.log'" if excluded else ""
    rule = " Leave out every `.log` file." if excluded else ""
    return Draft(
        description=(
            f"Create the gzip-compressed tar archive `{archive}` containing the directory `{site}/`, with member "
            f"names starting with `{site}/` (as `tar` stores them when run from your home directory).{rule} "
            f"{WHERE}"
        ),
        files=files,
        checks=[{"kind": "tar_members", "path": archive, "compression": "gz", "expected": expected}],
        solution=[f"mkdir -p backup && tar -czf {archive}{exclude} {site}"],
    )


def extract_subset(rng: random.Random, difficulty: int) -> Draft:
    content = _tree_files(rng, "bundle", 5 + 2 * difficulty, difficulty, ("conf", "txt", "json"))
    content["bundle/config/main.conf"] = f"name = {rng.choice(WORDS)}\n"
    content["bundle/config/extra.conf"] = f"level = {rng.randint(1, 9)}\n"
    compressed = difficulty != 2
    archive = f"incoming/bundle.{'tar.gz' if compressed else 'tar'}"
    if difficulty == 1:
        wanted, what, members = content, "the whole archive", ""
    else:
        wanted = {p: c for p, c in content.items() if p.startswith("bundle/config/")}
        what, members = "only the `bundle/config/` directory of the archive (nothing else)", " bundle/config"
    expected = {p[len("bundle/") :]: c for p, c in wanted.items()}
    data = _tar_bytes(content, compressed)
    return Draft(
        description=(
            f"`{archive}` is a tar archive whose members start with `bundle/`. Extract {what} into the "
            f"directory `restored/`, dropping the leading `bundle/` component (so `bundle/x` becomes "
            f"`restored/x`). Keep the archive. {WHERE}"
        ),
        files={archive: data},
        checks=[
            {"kind": "dir_files", "path": "restored", "expected": expected},
            {"kind": "file_sha256", "path": archive, "sha256": hashlib.sha256(data).hexdigest()},
        ],
        solution=[f"mkdir -p restored && tar -xf {archive} -C restored --strip-components=1{members}"],
    )


def list_large_members(rng: random.Random, difficulty: int) -> Draft:
    threshold = rng.randrange(200, 1200, 50)
    content = {}
    for index, stem in enumerate(stems(rng, 5 + 3 * difficulty, min(difficulty, 2))):
        big = index < 2 or rng.random() < 0.4
        size = rng.randint(threshold + 5, 3 * threshold) if big else rng.randint(5, threshold - 5)
        folder = "release" if difficulty == 1 else f"release/{rng.choice(('bin', 'lib', 'share'))}"
        content[f"{folder}/{stem}.bin"] = ((stem + " ") * (size // 2 + 1))[:size]
    expected = sorted((p for p, c in content.items() if len(c) > threshold), key=str.encode)
    return Draft(
        description=(
            f"`release.tar` is a tar archive. Without extracting it, write the names of its members that are "
            f"larger than {threshold} bytes, as stored in the archive, one per line, sorted in plain byte order "
            f"(`LC_ALL=C sort`), to `large_members.txt`. {WHERE}"
        ),
        files={"release.tar": _tar_bytes(content, compress=False)},
        checks=[
            {"kind": "file_text", "path": "large_members.txt", "expected": "\n".join(expected), "mode": "lines"},
            {"kind": "file_absent", "path": expected[0]},
        ],
        solution=[f"tar -tvf release.tar | awk '$3 > {threshold} {{print $6}}' | LC_ALL=C sort > large_members.txt"],
    )


def gzip_exports(rng: random.Random, difficulty: int) -> Draft:
    names = stems(rng, 2 + 2 * difficulty, difficulty)
    files: dict[str, str | bytes] = {}
    for stem in names:
        files[f"exports/{stem}.csv"] = "id,value\n" + "".join(f"{i},{rng.randint(0, 999)}\n" for i in range(rng.randint(3, 20)))
    files["exports/README.txt"] = "exports of the nightly job\n"
    checks: list[dict] = []
    for path, content in files.items():
        if path.endswith(".csv"):
            checks.append({"kind": "gzip_text", "path": path + ".gz", "expected": content})
            checks.append({"kind": "file_absent", "path": path})
    checks.append({"kind": "file_text", "path": "exports/README.txt", "expected": files["exports/README.txt"],
                   "mode": "exact"})
    return Draft(
        description=(
            "Compress every `.csv` file in `exports/` with gzip, so that each `NAME.csv` is replaced by "
            f"`NAME.csv.gz` (the uncompressed originals must be gone). Leave other files alone. {WHERE}"
        ),
        files=files,
        checks=checks,
        solution=["find exports -maxdepth 1 -type f -name '*.csv' -exec gzip {} +"],
    )


VARIANTS = {
    "create_backup": create_backup,
    "extract_subset": extract_subset,
    "list_large_members": list_large_members,
    "gzip_exports": gzip_exports,
}
