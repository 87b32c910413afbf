"""Harbor (and Terminal-Bench) task folders as ``TerminalTask``\\ s, so ``rl-llm/Terminal-v0`` runs them.

A Harbor task folder (the format SkyRL, verifiers, TRL and NeMo Gym read for terminal and SWE tasks)::

    task-name/
      instruction.md          what the agent is asked (the task description)
      task.toml               metadata ([metadata] difficulty, [verifier] timeout_sec, ...)
      environment/Dockerfile  the container: WORKDIR, COPY/ADD of files from environment/, RUN steps
      solution/solve.sh       the oracle's solution
      tests/test.sh           the verifier; writes /logs/verifier/reward.txt (or reward.json) or exits 0

The older Terminal-Bench layout (``task.yaml`` with ``instruction:``, ``run-tests.sh``, ``solution.sh``,
``Dockerfile`` and ``tests/`` at the top) is read too. The format is detected per folder, so one tasks
folder may mix Harbor, Terminal-Bench and rl-llm's own task directories.

How a Docker task maps onto rl-llm's sandbox (bubblewrap or Docker with rl-llm's image, no network):

- The Dockerfile is not built. Files it COPYs/ADDs from ``environment/`` become the workspace's initial
  files, its RUN steps become the setup script, except steps with package installs (apt/pip/uv/curl/...),
  which need the network: a task whose tools are not in rl-llm's sandbox image cannot pass.
- The task's WORKDIR (``/app`` by default) is the sandbox workspace: ``/app/x`` in the instruction, the
  tests and the solution is rewritten to ``./x`` (everything runs in the workspace).
- The verifier's ``tests/`` folder travels with the check, never into the workspace: after the episode it is
  unpacked to a private directory, ``/tests`` and ``/logs/verifier`` are pointed there, and ``test.sh``
  runs. The task passes when its reward file holds a reward >= 1, or, without one, when it exits 0.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shlex
from pathlib import Path
from typing import Any

from rl_llm.envs.terminal.task import TerminalTask, check_links_stay_inside, read_task_text, resolved_link

#: Two small example tasks in Harbor format, shipped with the package.
EXAMPLES_DIR = Path(__file__).parent / "harbor_examples"
DEFAULT_WORKDIR = "/app"
# Where the verifier's files live while the check runs (the sandbox's /tmp is private to it).
CHECK_ROOT = "/tmp/rl-llm-harbor"
# RUN steps that fetch packages: skipped, the sandbox has no network and ships its own tools.
PACKAGE_INSTALL = re.compile(r"^\s*(sudo\s+)?(apt(-get)?|yum|dnf|apk|pip3?|uv|uvx|conda|npm|curl|wget)\b")
DIFFICULTY = {"easy": 1, "medium": 2, "hard": 3}


def harbor_layout(path: Path) -> str | None:
    """``"harbor"``, ``"terminal-bench"`` or None (not a task folder of either format)."""
    if (path / "instruction.md").is_file() and (path / "tests" / "test.sh").is_file():
        return "harbor"
    if (path / "task.yaml").is_file() and (path / "run-tests.sh").is_file():
        return "terminal-bench"
    return None


def is_harbor_task_dir(path: str | Path) -> bool:
    return harbor_layout(Path(path)) is not None


def load_harbor_task(path: str | Path, family: str = "harbor") -> TerminalTask:
    """A ``TerminalTask`` from one Harbor or Terminal-Bench task folder."""
    root = Path(path)
    layout = harbor_layout(root)
    if layout is None:
        raise FileNotFoundError(f"{root} is not a Harbor task folder (instruction.md + tests/test.sh)")
    check_links_stay_inside(root)
    if layout == "harbor":
        meta = _read_toml(root / "task.toml")
        instruction = read_task_text(root / "instruction.md")
        dockerfile, context = root / "environment" / "Dockerfile", root / "environment"
        test_entry, solution = "test.sh", root / "solution" / "solve.sh"
        metadata = meta.get("metadata", {})
        if not isinstance(metadata, dict):  # metadata = "hard" was an AttributeError out of reset()
            raise ValueError(f"{root / 'task.toml'}: metadata must be a table ([metadata]), got {metadata!r}")
        difficulty = metadata.get("difficulty", "")
    else:
        import yaml

        from rl_llm.paths import load_yaml, yaml_problem

        try:  # a repeated key is an error, not last-wins
            meta = load_yaml(read_task_text(root / "task.yaml")) or {}
        except yaml.YAMLError as error:
            raise ValueError(f"{root / 'task.yaml'}: not valid YAML ({yaml_problem(error)})") from None
        if not isinstance(meta, dict):  # a list or a string was an AttributeError out of reset()
            raise ValueError(f"{root / 'task.yaml'}: must be a mapping (instruction, difficulty, ...), got "
                             f"{type(meta).__name__}")  # fmt: skip
        instruction = str(meta.get("instruction", ""))
        dockerfile, context = root / "Dockerfile", root
        test_entry, solution = "run-tests.sh", root / "solution.sh"
        difficulty = meta.get("difficulty", "")
    workdir, files, setup = read_dockerfile(dockerfile, context)
    tests = _test_files(root, layout)
    check = {"kind": "bash_test", "source": verifier_script(tests, test_entry, workdir)}
    solve = rewrite_workdir(read_task_text(solution), workdir) if solution.is_file() else ""
    digest = hashlib.sha1(repr((instruction, sorted(tests.items()))).encode()).hexdigest()[:10]
    return TerminalTask(
        task_id=f"terminal/{family}/{root.name}/{digest}",
        family=family,
        difficulty=DIFFICULTY.get(str(difficulty).lower(), 0),
        description=rewrite_workdir(instruction, workdir).strip(),
        files=files,
        setup=setup,
        checks=(check,),
        solution=(solve,) if solve.strip() else (),
        variant=root.name,
    )


def rewrite_workdir(text: str, workdir: str) -> str:
    """``/app/x`` -> ``./x`` and a bare ``/app`` -> ``.``: the task's WORKDIR is the sandbox's workspace."""
    if workdir in ("", "/"):
        return text
    pattern = re.compile(rf"(?<![\w./-]){re.escape(workdir.rstrip('/'))}(?=/|\b|$)")
    return pattern.sub(".", text)


def read_dockerfile(dockerfile: Path, context: Path) -> tuple[str, dict[str, str | bytes], str]:
    """``(workdir, files, setup)`` from a Dockerfile: its WORKDIR, the local files it copies into the workdir
    (paths relative to it) and its RUN steps as a setup script (package installs left out)."""
    workdir, files, steps = DEFAULT_WORKDIR, {}, []
    if not dockerfile.is_file():
        return workdir, files, ""
    for instruction, argument in _dockerfile_instructions(read_task_text(dockerfile)):
        if instruction == "WORKDIR":
            workdir = argument.strip()
        elif instruction in ("COPY", "ADD"):
            try:
                files.update(_copied_files(argument, context, workdir))
            except ValueError as error:  # shlex's "No closing quotation", a symlink loop: name the Dockerfile
                raise ValueError(f"{dockerfile}: {instruction} {argument}: {error}") from None
        elif instruction == "RUN" and not any(
            PACKAGE_INSTALL.match(part) for part in re.split(r"&&|;|\|\|", argument)
        ):
            steps.append(
                rewrite_workdir(argument, workdir)
            )  # a step with an install is its cleanup too: all skipped
    return workdir, files, "\n".join(steps) + ("\n" if steps else "")


def _dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, argument)`` pairs, with backslash continuations joined and comments dropped."""
    joined, current = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") and not current:
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        joined.append(current + line)
        current = ""
    if current:
        joined.append(current)
    result = []
    for line in joined:
        head, _, argument = line.strip().partition(" ")
        if head:
            result.append((head.upper(), argument.strip()))
    return result


def _copied_files(argument: str, context: Path, workdir: str) -> dict[str, str | bytes]:
    words = [w for w in shlex.split(argument) if not w.startswith("--")]
    if len(words) < 2:
        return {}
    *sources, destination = words
    if not destination.startswith("/"):
        destination = f"{workdir.rstrip('/')}/{destination}"
    base = workdir.rstrip("/") + "/"
    if not (destination + "/").startswith(base):
        return {}  # outside the workdir (e.g. /usr/local/bin): not part of the workspace
    target = destination[len(base) :] if len(destination) >= len(base) else ""
    out: dict[str, str | bytes] = {}
    for source in sources:
        path = resolved_link(context / source)
        if not path.is_relative_to(context.resolve()) or not path.exists():
            continue
        if path.is_file():
            name = (
                target + path.name
                if (not target or destination.endswith("/") or len(sources) > 1)
                else target
            )
            out[name] = _content(path)
        else:
            for item in sorted(p for p in path.rglob("*") if p.is_file()):
                out[str(Path(target) / item.relative_to(path)) if target else str(item.relative_to(path))] = (
                    _content(item)
                )
    return out


def _content(path: Path) -> str | bytes:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


def _test_files(root: Path, layout: str) -> dict[str, bytes]:
    """The verifier's files, by path relative to the tests folder (Terminal-Bench's run-tests.sh included)."""
    tests = root / "tests"
    files = (
        {str(p.relative_to(tests)): p.read_bytes() for p in sorted(tests.rglob("*")) if p.is_file()}
        if tests.is_dir()
        else {}
    )
    if layout == "terminal-bench":
        files["run-tests.sh"] = (root / "run-tests.sh").read_bytes()
    return files


def verifier_script(tests: dict[str, bytes], entry: str, workdir: str) -> str:
    """The bash check: unpack the tests privately, run the entry script, pass on reward >= 1 (or exit 0)."""
    unpack = []
    for rel, data in tests.items():
        text = data.decode("utf-8", "replace") if _is_text(data) else None
        if text is not None:  # point the verifier's absolute paths at the private copies and the workspace
            text = rewrite_workdir(text, workdir).replace("/logs/verifier", f"{CHECK_ROOT}/logs/verifier")
            text = re.sub(r"(?<![\w.-])/tests(?=/|\b)", f"{CHECK_ROOT}/tests", text)
            data = text.encode("utf-8")
        quoted = shlex.quote(f"{CHECK_ROOT}/tests/{rel}")
        unpack.append(
            f'mkdir -p "$(dirname {quoted})" && printf %s {base64.b64encode(data).decode()} | base64 -d > {quoted}'
        )
    return "\n".join([
        f"rm -rf {CHECK_ROOT} && mkdir -p {CHECK_ROOT}/tests {CHECK_ROOT}/logs/verifier {CHECK_ROOT}/logs/agent",
        *unpack,
        f"export TEST_DIR={CHECK_ROOT}/tests",
        f"bash {shlex.quote(f'{CHECK_ROOT}/tests/{entry}')} > {CHECK_ROOT}/logs/verifier/test-output.txt 2>&1",
        "status=$?",
        f"tail -c 400 {CHECK_ROOT}/logs/verifier/test-output.txt",
        f"reward={CHECK_ROOT}/logs/verifier/reward",
        'if [ -s "$reward.txt" ]; then awk \'NR == 1 { exit !($1 + 0 >= 1) }\' "$reward.txt"; exit $?; fi',
        'if [ -s "$reward.json" ]; then',
        '  python3 -c \'import json, sys; r = json.load(open(sys.argv[1])); r = r.get("reward", 0) if isinstance(r, dict) else r; sys.exit(0 if float(r) >= 1 else 1)\' "$reward.json"; exit $?',
        "fi",
        "exit $status",
        "",
    ])  # fmt: skip


def _is_text(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\x00" not in data


def _read_toml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:  # tomllib refuses a repeated key itself, naming its line but not the file
        return tomllib.loads(read_task_text(path))
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path}: not valid TOML ({error})") from None
