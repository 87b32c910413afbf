"""Check that the extras of pyproject.toml install with ``pip install 'rl-llm[NAME]'``: pip resolves them from
scratch (``--dry-run --ignore-installed``: no package is installed and nothing in this venv changes). Prints one
line per case and exits 1 if any fails, naming pip's own reason.

    python .ci/check_extras.py            # all extras together (what CI runs)
    python .ci/check_extras.py --each     # every extra alone, then all together
    python .ci/check_extras.py NAME ...   # these extras, each alone

All together is the one case CI needs: whatever set of versions satisfies every extra at once also satisfies
each extra alone. CI's real installs (.ci/run) are the import smoke test on top."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def extras() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return list(project.get("optional-dependencies", {}))


def resolve(names: list[str]) -> tuple[bool, str]:
    """Whether pip resolves ``.[names]`` in an empty environment; the reason or a short summary."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                   "--report", str(report), f"{ROOT}[{','.join(names)}]"]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.strip() and "WARNING: Location" not in line]
            return False, " | ".join(lines[-6:]) or f"pip exited {done.returncode}"
        installs = json.loads(report.read_text())["install"]
        versions = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in installs}
        picked = ", ".join(f"{name}=={versions[name]}" for name in sorted(versions)
                           if name in {"verifiers", "openenv-core", "fastmcp", "mcp", "verl", "transformers"})
        return True, f"{len(installs)} packages" + (f" ({picked})" if picked else "")


def main(argv: list[str]) -> int:
    if argv == ["--each"]:
        cases = [[name] for name in extras()] + [extras()]
    else:
        cases = [[name] for name in argv] if argv else [extras()]
    failed = 0
    for names in cases:
        start = time.monotonic()
        ok, detail = resolve(names)
        failed += not ok
        label = ",".join(names) if len(names) == 1 else "all extras together"
        print(f"{'ok  ' if ok else 'FAIL'} rl-llm[{label}]: {detail} ({time.monotonic() - start:.0f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
