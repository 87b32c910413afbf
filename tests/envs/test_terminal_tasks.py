"""The terminal task generator, the hand-written task loader and the checker program (``workspace_checker.py``).

The checker runs here as it does in the sandbox (``python3 -I -S -`` reading the program on stdin, in the
workspace directory), only without the sandbox around it, so these tests need no bwrap.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from rl_llm.envs.terminal import (
    DIFFICULTIES,
    FAMILIES,
    TerminalTask,
    generate_task,
    load_task_dir,
    load_task_folder,
)
from rl_llm.envs.terminal.families.permissions import symbolic
from rl_llm.envs.terminal.protocol import RUNNER_COMMAND, parse_verdict, runner_program
from rl_llm.envs.terminal.workspace_checker import expand_cron_field, parse_crontab, parse_env_file


def run_runner(payload: dict, workspace: Path) -> tuple[bool, str]:
    program, nonce = runner_program(payload)
    done = subprocess.run(RUNNER_COMMAND, input=program.encode(), capture_output=True, cwd=workspace,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(workspace)}, timeout=120, check=False)
    verdict = parse_verdict(done.stdout.decode(), nonce)
    assert verdict is not None, done.stderr.decode()
    return verdict


def check(workspace: Path, *checks: dict) -> tuple[bool, str]:
    return run_runner({"mode": "check", "checks": list(checks)}, workspace)


def fingerprint(task: TerminalTask) -> str:
    return hashlib.sha1(repr((task.description, sorted(task.files.items()), task.setup, task.checks)).encode()).hexdigest()


# -- generator --------------------------------------------------------------------------------------------
def test_ten_families_with_several_variants_each() -> None:
    assert len(FAMILIES) >= 10
    assert {"files", "logs", "data", "text", "scripting", "permissions", "archives", "config", "git", "sqlite"} <= set(FAMILIES)
    assert all(len(variants) >= 4 for variants in FAMILIES.values())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_seeds_give_distinct_tasks_and_cover_variants_and_levels(family: str) -> None:
    tasks = [generate_task(seed, family) for seed in range(400)]
    assert len({fingerprint(task) for task in tasks}) == len(tasks)
    assert {task.variant for task in tasks} == set(FAMILIES[family])
    assert {task.difficulty for task in tasks} == set(DIFFICULTIES)
    assert all(task.family == family and task.checks and task.solution for task in tasks)
    assert all(len(task.solution) < 16 for task in tasks), "the oracle must fit within max_turns"


def test_same_seed_same_task_and_filters_apply() -> None:
    assert generate_task(7, "git", 2) == generate_task(7, "git", 2)
    assert generate_task(7).task_id == generate_task(7).task_id
    assert fingerprint(generate_task(7, "git", 2)) != fingerprint(generate_task(8, "git", 2))
    assert {generate_task(s, ["logs", "data"], [1, 3]).family for s in range(40)} == {"logs", "data"}
    assert {generate_task(s, None, 3).difficulty for s in range(20)} == {3}
    assert generate_task(3, "files", variant="rename_extension").variant == "rename_extension"


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"family": "nope"}, "unknown task family"), ({"difficulty": 4}, "unknown difficulty"),
    ({"family": []}, "unknown task family"), ({"family": "git", "variant": "nope"}, "unknown variant"),
])
def test_bad_filters_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        generate_task(0, **kwargs)


def test_task_record_refuses_paths_outside_the_workspace_and_missing_checks() -> None:
    with pytest.raises(ValueError, match="inside the workspace"):
        TerminalTask("t", "custom", 1, "do it", files={"../x": "a"}, checks=({"kind": "file_absent", "path": "x"},))
    with pytest.raises(ValueError, match="no completion check"):
        TerminalTask("t", "custom", 1, "do it")


def test_symbolic_modes() -> None:
    assert symbolic(0o754) == "rwxr-xr--"
    assert symbolic(0o600) == "rw-------"


# -- hand-written tasks -----------------------------------------------------------------------------------
def write_task(root: Path, name: str, test_name: str, test: str, solution: str | None = None) -> Path:
    task = root / name
    task.mkdir(parents=True)
    (task / "description.md").write_text(f"Create greeting.txt saying hello from {name}.\n")
    (task / "setup.sh").write_text("mkdir -p inbox\necho seed > inbox/seed.txt\n")
    (task / test_name).write_text(test)
    if solution is not None:
        (task / "solution.sh").write_text(solution)
    return task


BASH_TEST = '[ "$(cat greeting.txt)" = "hello" ] && [ -f inbox/seed.txt ]\n'
PY_TEST = "from pathlib import Path\n\ndef test_greeting():\n    assert Path('greeting.txt').read_text().strip() == 'hello'\n"


def test_task_folder_loader(tmp_path: Path) -> None:
    write_task(tmp_path, "b_python", "test_final_state.py", PY_TEST)
    write_task(tmp_path, "a_bash", "test.sh", BASH_TEST, solution="echo hello > greeting.txt\n")
    (tmp_path / "not_a_task").mkdir()
    tasks = load_task_folder(tmp_path)
    assert [t.variant for t in tasks] == ["a_bash", "b_python"]
    assert tasks[0].checks[0]["kind"] == "bash_test" and tasks[1].checks[0]["kind"] == "python_tests"
    assert tasks[0].solution == ("echo hello > greeting.txt\n",) and tasks[1].solution == ()
    assert "inbox" in tasks[0].setup
    assert load_task_dir(tmp_path / "a_bash") == tasks[0]


def test_task_loader_errors_name_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_task_dir(tmp_path / "absent")
    (tmp_path / "t").mkdir()
    with pytest.raises(FileNotFoundError, match=r"description\.md"):
        load_task_dir(tmp_path / "t")
    (tmp_path / "t" / "description.md").write_text("x")
    with pytest.raises(FileNotFoundError, match="completion test"):
        load_task_dir(tmp_path / "t")
    with pytest.raises(FileNotFoundError, match="no task directories"):
        load_task_folder(tmp_path / "t")


@pytest.mark.parametrize(("test_name", "test"), [("test.sh", BASH_TEST), ("test_final_state.py", PY_TEST)])
def test_hand_written_checks_run_in_the_checker(tmp_path: Path, test_name: str, test: str) -> None:
    task = load_task_dir(write_task(tmp_path / "tasks", "greet", test_name, test))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    assert run_runner(task.setup_payload(), workspace) == (True, "ready")
    assert not check(workspace, *task.checks)[0]
    (workspace / "greeting.txt").write_text("hello\n")
    assert check(workspace, *task.checks) == (True, "all checks passed")


# -- the checker --------------------------------------------------------------------------------------------
def test_setup_writes_files_runs_the_script_and_pins_mtimes(tmp_path: Path) -> None:
    payload = {"mode": "setup", "files": {"a/b.txt": {"text": "hi"}, "c.bin": {"b64": "AAE="}},
               "script": "chmod 600 a/b.txt\nmkdir made\n"}
    assert run_runner(payload, tmp_path) == (True, "ready")
    assert (tmp_path / "a/b.txt").read_text() == "hi" and (tmp_path / "c.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "a/b.txt").stat().st_mode & 0o777 == 0o600 and (tmp_path / "made").is_dir()
    assert (tmp_path / "a/b.txt").stat().st_mtime == (tmp_path / "made").stat().st_mtime == 1704067200
    failed = run_runner({"mode": "setup", "files": {}, "script": "echo broken >&2\nexit 3\n"}, tmp_path)
    assert failed[0] is False and "status 3" in failed[1] and "broken" in failed[1]


@pytest.mark.parametrize(("mode", "expected", "good", "bad"), [
    ("lines", "a\nb", "a  \nb\n\n", "b\na\n"),
    ("exact", "a\n", "a\n", "a"),
    ("stripped", "42", " 42\n", "42 1"),
    ("sorted_lines", "a\nb", "b\na\n", "a\n"),
    ("number", "3.14", "3.141\n", "3.2"),
    ("json", '{"x": [1, 2.5]}', '{"x":[1,2.5001]}', '{"x": [1, true]}'),
    ("csv", "id,name\n1,Ann", "id, name\r\n1,Ann\r\n", "id,name\n1,Bob\n"),
])
def test_file_text_modes(tmp_path: Path, mode: str, expected: str, good: str, bad: str) -> None:
    spec = {"kind": "file_text", "path": "out.txt", "expected": expected, "mode": mode, "tol": 0.01}
    assert not check(tmp_path, spec)[0]  # missing file
    (tmp_path / "out.txt").write_text(good)
    assert check(tmp_path, spec)[0]
    (tmp_path / "out.txt").write_text(bad)
    assert not check(tmp_path, spec)[0]


def test_checks_refuse_fifos_symlinked_devices_and_huge_files(tmp_path: Path) -> None:
    import os

    spec = {"kind": "file_text", "path": "out.txt", "expected": "x", "mode": "stripped"}
    os.mkfifo(tmp_path / "out.txt")  # opening it would block the checker forever
    assert check(tmp_path, spec) == (False, "out.txt: missing (or not a regular file)")
    (tmp_path / "out.txt").unlink()
    (tmp_path / "out.txt").symlink_to("/dev/zero")
    assert not check(tmp_path, spec)[0]
    (tmp_path / "out.txt").unlink()
    with open(tmp_path / "out.txt", "wb") as handle:
        handle.truncate(9 << 20)
    assert "larger than" in check(tmp_path, spec)[1]


def test_first_failure_is_reported_without_the_expected_value(tmp_path: Path) -> None:
    (tmp_path / "answer.txt").write_text("wrong")
    passed, message = check(tmp_path, {"kind": "file_text", "path": "answer.txt", "expected": "SECRET-7", "mode": "stripped"})
    assert not passed and "answer.txt" in message and "SECRET" not in message


def test_dir_files_and_modes(tmp_path: Path) -> None:
    (tmp_path / "d/sub").mkdir(parents=True)
    (tmp_path / "d/a").write_text("1")
    (tmp_path / "d/sub/b").write_text("2")
    spec = {"kind": "dir_files", "path": "d", "expected": {"a": "1", "sub/b": None}}
    assert check(tmp_path, spec)[0]
    (tmp_path / "d/extra").write_text("")
    assert "unexpected" in check(tmp_path, spec)[1]
    (tmp_path / "d/extra").unlink()
    (tmp_path / "d/a").write_text("changed")
    assert not check(tmp_path, spec)[0]
    (tmp_path / "d/a").chmod(0o640)
    assert check(tmp_path, {"kind": "file_mode", "path": "d/a", "mode": 0o640})[0]
    assert not check(tmp_path, {"kind": "file_mode", "path": "d/a", "mode": 0o644})[0]


def test_script_io_runs_hidden_cases_with_args_stdin_files_and_exit_codes(tmp_path: Path) -> None:
    script = tmp_path / "bin/tool"
    script.parent.mkdir()
    script.write_text('#!/bin/bash\n[ -f "$1" ] || exit 3\ntr a-z A-Z < "$1"; cat\n')
    spec = {"kind": "script_io", "path": "bin/tool", "cases": [
        {"args": ["{dir}/in.txt"], "files": {"in.txt": "abc\n"}, "stdin": "tail\n", "stdout": "ABC\ntail\n"},
        {"args": ["/nonexistent"], "exit_code": 3, "stdout": ""},
    ]}
    assert "not executable" in check(tmp_path, spec)[1]
    script.chmod(0o755)
    assert check(tmp_path, spec)[0]
    spec["cases"][0]["stdout"] = "abc\ntail\n"
    assert "hidden test 1" in check(tmp_path, spec)[1]
    script.write_text("#!/bin/bash\nsleep 30\n")
    spec["timeout"] = 1
    assert "timed out" in check(tmp_path, spec)[1]


def test_cron_fields_expand_to_the_same_schedule() -> None:
    assert expand_cron_field("*/15", 0) == [0, 15, 30, 45] == expand_cron_field("0,15,30,45", 0)
    assert expand_cron_field("mon-fri", 4) == [1, 2, 3, 4, 5] == expand_cron_field("1-5", 4)
    assert expand_cron_field("7", 4) == [0] == expand_cron_field("sun", 4)
    with pytest.raises(ValueError):
        expand_cron_field("61", 0)
    jobs = parse_crontab("# nightly\nSHELL=/bin/bash\n@daily /a.sh\n0 0 * * * /a.sh\n\n*/30 9-17 * * 1-5  /b.sh  \n")
    assert len(jobs) == 3 and len(set(jobs)) == 2  # @daily and "0 0 * * *" are the same job


def test_env_file_parsing() -> None:
    assert parse_env_file("# c\nexport A=1\nB = 'two'\n\nC=x=y\n") == {"A": "1", "B": "two", "C": "x=y"}


def test_structured_config_checks(tmp_path: Path) -> None:
    (tmp_path / "c.ini").write_text("; comment\n[s]\nKey = v\n")
    assert check(tmp_path, {"kind": "ini", "path": "c.ini", "expected": {"s": {"Key": "v"}}})[0]
    assert not check(tmp_path, {"kind": "ini", "path": "c.ini", "expected": {"s": {"key": "v"}}})[0]
    (tmp_path / "cron").write_text("30 2 * * * /x.sh\n")
    assert check(tmp_path, {"kind": "cron", "path": "cron", "expected": [["30", "2", "*", "*", "*", "/x.sh"]]})[0]
    assert not check(tmp_path, {"kind": "cron", "path": "cron", "expected": [["30", "3", "*", "*", "*", "/x.sh"]]})[0]


def test_archive_and_database_checks(tmp_path: Path) -> None:
    import gzip
    import sqlite3
    import tarfile

    (tmp_path / "src").mkdir()
    (tmp_path / "src/a.txt").write_text("A")
    with tarfile.open(tmp_path / "a.tar.gz", "w:gz") as archive:
        archive.add(tmp_path / "src", arcname="./src")
    spec = {"kind": "tar_members", "path": "a.tar.gz", "compression": "gz", "expected": {"src/a.txt": "A"}}
    assert check(tmp_path, spec)[0]
    assert not check(tmp_path, {**spec, "expected": {"src/a.txt": "B"}})[0]
    (tmp_path / "x.gz").write_bytes(gzip.compress(b"data"))
    assert check(tmp_path, {"kind": "gzip_text", "path": "x.gz", "expected": "data"})[0]
    connection = sqlite3.connect(tmp_path / "db.sqlite")
    connection.executescript("CREATE TABLE t (id INTEGER, price REAL); INSERT INTO t VALUES (1, 2.5);")
    connection.commit()
    connection.close()
    query = {"kind": "sqlite_query", "db": "db.sqlite", "query": "SELECT id, price FROM t", "tol": 0.01}
    assert check(tmp_path, {**query, "expected": [[1, 2.504]]})[0]
    assert not check(tmp_path, {**query, "expected": [[1, 2.6]]})[0]
    assert not check(tmp_path, {**query, "query": "SELECT nope FROM t", "expected": []})[0]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_oracle_commands_pass_and_the_initial_state_fails(tmp_path: Path, family: str) -> None:
    """Outside the sandbox (plain bash in a temp dir): a fast guard on every family's ground truth."""
    for seed in (0,):
        task = generate_task(seed, family)
        for solve in (False, True):
            workspace = tmp_path / f"{seed}-{solve}"
            workspace.mkdir()
            assert run_runner(task.setup_payload(), workspace) == (True, "ready")
            for command in task.solution if solve else ():
                subprocess.run(["bash", "-c", command], cwd=workspace, check=True, capture_output=True,
                               env={"PATH": "/usr/bin:/bin", "HOME": str(workspace)})
            assert check(workspace, *task.checks)[0] is solve, task.task_id
