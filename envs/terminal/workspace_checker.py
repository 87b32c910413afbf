"""The program that builds a task's workspace and checks its final state, run inside the sandbox.

It is sent as text on the stdin of ``python3 -I -S -`` (see ``protocol.runner_program``), never written to
the workspace, so the agent can neither read nor edit it. Standard library only, because it runs on the
sandbox's system Python. The result is one line ``RLLM-RESULT <tag> <0|1> <message as a Python literal>``
on stdout; the tag is an HMAC of the rest of the line under a key that is random per call and never printed
(see ``protocol.runner_program``), so output printed by an agent's program (run by a ``script_io`` check)
cannot pose as the verdict, not even one that reads the verdict off the run's stdout pipe.

Every check takes paths relative to the workspace (the current directory). Expected values travel inside
the program, so deleting or editing files in the workspace can only make a check fail.
"""

import os
import stat
import sys

# Modules beyond these three are imported inside the functions that use them: the runner starts once per
# reset and once per check, and importing everything up front would double its start-up time.

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_READ = 8 << 20  # bytes: a check never reads more of one file (an agent may have written gigabytes)
# 2024-01-01T00:00:00Z: mtimes and commit dates of every initial workspace, also used by the host-side task
# generators (archive member mtimes, commit dates), which import it: importing this module has no side effects.
FIXED_EPOCH = 1704067200
TEST_TIMEOUT_S = 30


class CheckFailed(Exception):
    """A check's verdict. Messages name the file and what is wrong, never the expected value."""


# -- helpers ----------------------------------------------------------------------------------------------
def _read(path, limit=MAX_READ):
    if os.path.islink(path) and not os.path.exists(path):
        raise CheckFailed(f"{path}: broken symlink")
    if not os.path.isfile(path):
        raise CheckFailed(f"{path}: missing (or not a regular file)")
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise CheckFailed(f"{path}: larger than {limit} bytes")
    return data


def _read_text(path):
    try:
        return _read(path).decode("utf-8")
    except UnicodeDecodeError:
        raise CheckFailed(f"{path}: not UTF-8 text") from None


def _lines(text):
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _close(actual, expected, tol):
    import math

    return math.isclose(float(actual), float(expected), rel_tol=0.0, abs_tol=tol)


def _same_json(actual, expected, tol):
    if isinstance(expected, bool) or expected is None:
        return actual is expected
    if isinstance(expected, (int, float)):
        return isinstance(actual, (int, float)) and not isinstance(actual, bool) and _close(actual, expected, tol)
    if isinstance(expected, dict):
        return isinstance(actual, dict) and actual.keys() == expected.keys() and all(
            _same_json(actual[key], value, tol) for key, value in expected.items()
        )
    if isinstance(expected, list):
        return isinstance(actual, list) and len(actual) == len(expected) and all(
            _same_json(a, e, tol) for a, e in zip(actual, expected)
        )
    return actual == expected


def _same_rows(actual, expected, tol):
    if len(actual) != len(expected):
        return False
    for row, want in zip(actual, expected):
        if len(row) != len(want):
            return False
        for value, target in zip(row, want):
            if isinstance(target, float) and not isinstance(value, str):
                if value is None or not _close(value, target, tol):
                    return False
            elif value != target:
                return False
    return True


def _safe_env(**extra):
    env = {"PATH": SAFE_PATH, "HOME": os.getcwd(), "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
    env.update(extra)
    return env


# -- file checks ------------------------------------------------------------------------------------------
def check_file_text(spec):
    path, expected, mode = spec["path"], spec["expected"], spec.get("mode", "lines")
    text = _read_text(path)
    tol = spec.get("tol", 1e-6)
    if mode == "exact":
        ok = text == expected
    elif mode == "lines":
        ok = _lines(text) == _lines(expected)
    elif mode == "sorted_lines":
        ok = sorted(_lines(text)) == sorted(_lines(expected))
    elif mode == "stripped":
        ok = text.strip() == expected.strip()
    elif mode == "number":
        try:
            ok = _close(float(text.strip()), float(expected), tol)
        except ValueError:
            raise CheckFailed(f"{path}: not a single number") from None
    elif mode == "json":
        import json

        try:
            ok = _same_json(json.loads(text), json.loads(expected), tol)
        except ValueError:
            raise CheckFailed(f"{path}: not valid JSON") from None
    elif mode == "csv":
        import csv
        import io

        actual_rows = [[cell.strip() for cell in row] for row in csv.reader(io.StringIO(text)) if row]
        expected_rows = [row for row in csv.reader(io.StringIO(expected)) if row]
        ok = actual_rows == expected_rows
    else:
        raise ValueError(f"unknown file_text mode {mode!r}")
    if not ok:
        raise CheckFailed(f"{path}: content is not what the task asks for")


def check_file_sha256(spec):
    import hashlib

    if hashlib.sha256(_read(spec["path"])).hexdigest() != spec["sha256"]:
        raise CheckFailed(f"{spec['path']}: was modified")


def check_file_absent(spec):
    if os.path.lexists(spec["path"]):
        raise CheckFailed(f"{spec['path']}: should not exist")


def check_dir_files(spec):
    """The regular files under a directory are exactly ``expected`` (relative path -> content or None)."""
    root, expected = spec["path"], spec["expected"]
    if not os.path.isdir(root) or os.path.islink(root):
        raise CheckFailed(f"{root}: missing directory")
    found = {}
    for directory, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            full = os.path.join(directory, name)
            found[os.path.relpath(full, root)] = full
    if set(found) != set(expected):
        missing, extra = len(set(expected) - set(found)), len(set(found) - set(expected))
        raise CheckFailed(f"{root}: wrong set of files ({missing} missing, {extra} unexpected)")
    for rel, content in expected.items():
        if os.path.islink(found[rel]):
            raise CheckFailed(f"{root}/{rel}: is a symlink, not a file")
        if content is not None and _read_text(found[rel]) != content:
            raise CheckFailed(f"{root}/{rel}: content changed")


def check_file_mode(spec):
    path = spec["path"]
    if not os.path.lexists(path) or os.path.islink(path):
        raise CheckFailed(f"{path}: missing")
    actual = stat.S_IMODE(os.lstat(path).st_mode)
    if actual != spec["mode"]:
        raise CheckFailed(f"{path}: permissions are {actual:o}, not what the task asks for")


def check_gzip_text(spec):
    import gzip

    path = spec["path"]
    try:
        with gzip.open(path, "rb") as handle:
            data = handle.read(MAX_READ + 1)
    except (OSError, EOFError):
        raise CheckFailed(f"{path}: missing or not a gzip file") from None
    if data.decode("utf-8", "replace") != spec["expected"]:
        raise CheckFailed(f"{path}: decompressed content differs")


def check_tar_members(spec):
    """The regular-file members of an archive are exactly ``expected`` (name -> content)."""
    import tarfile

    path, expected = spec["path"], spec["expected"]
    if not os.path.isfile(path):
        raise CheckFailed(f"{path}: missing")
    if spec.get("compression") == "gz":
        with open(path, "rb") as handle:
            if handle.read(2) != b"\x1f\x8b":
                raise CheckFailed(f"{path}: not gzip-compressed")
    members = {}
    try:
        with tarfile.open(path, "r:*") as archive:
            for member in archive.getmembers():
                name = member.name
                while name.startswith("./"):
                    name = name[2:]
                if member.isfile():
                    handle = archive.extractfile(member)
                    members[name] = handle.read(MAX_READ).decode("utf-8", "replace")
    except (tarfile.TarError, OSError, EOFError):
        raise CheckFailed(f"{path}: not a readable tar archive") from None
    if set(members) != set(expected):
        raise CheckFailed(f"{path}: wrong set of members")
    if any(members[name] != content for name, content in expected.items()):
        raise CheckFailed(f"{path}: a member's content differs")


# -- structured config ------------------------------------------------------------------------------------
def check_ini(spec):
    import configparser

    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str
    try:
        parser.read_string(_read_text(spec["path"]))
    except configparser.Error:
        raise CheckFailed(f"{spec['path']}: not a valid INI file") from None
    actual = {section: dict(parser[section]) for section in parser.sections()}
    if actual != spec["expected"]:
        raise CheckFailed(f"{spec['path']}: settings are not what the task asks for")


def parse_env_file(text):
    values = {}
    for line in _lines(text):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].strip()
        key, sep, value = line.partition("=")
        if not sep:
            raise CheckFailed(f"malformed line {line[:40]!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def check_env_file(spec):
    if parse_env_file(_read_text(spec["path"])) != spec["expected"]:
        raise CheckFailed(f"{spec['path']}: variables are not what the task asks for")


CRON_FIELDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
CRON_NAMES = (
    {},
    {},
    {},
    {m: i + 1 for i, m in enumerate(["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"])},
    {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])},
)
CRON_MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}


def _cron_value(token, index):
    token = token.lower()
    if token in CRON_NAMES[index]:
        return CRON_NAMES[index][token]
    return int(token)


def expand_cron_field(field, index):
    low, high = CRON_FIELDS[index]
    values = set()
    for part in field.split(","):
        step = 1
        if "/" in part:
            part, step_text = part.split("/", 1)
            step = int(step_text)
            if step < 1:
                raise ValueError("step must be positive")
        if part == "*":
            start, end = low, high
        elif "-" in part:
            first, last = part.split("-", 1)
            start, end = _cron_value(first, index), _cron_value(last, index)
        else:
            start = _cron_value(part, index)
            end = high if step > 1 else start
        if not (low <= start <= end <= high):
            raise ValueError("value out of range")
        values.update(range(start, end + 1, step))
    if index == 4 and 7 in values:  # 7 and 0 are both Sunday
        values = (values - {7}) | {0}
    return sorted(values)


def parse_crontab(text):
    """Jobs as (expanded schedule, command) pairs; comments, blank lines and VAR=value lines are skipped."""
    jobs = []
    for line in _lines(text):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        first = line.split(None, 1)[0]
        if "=" in first and not first[0].isdigit() and first[0] not in "*@":
            continue
        if first.startswith("@"):
            macro = CRON_MACROS.get(first.lower())
            if macro is None:
                raise CheckFailed(f"unsupported cron macro {first[:20]!r}")
            line = macro + " " + line[len(first) :].strip()
        parts = line.split(None, 5)
        if len(parts) < 6:
            raise CheckFailed(f"malformed cron line {line[:40]!r}")
        try:
            schedule = [expand_cron_field(field, i) for i, field in enumerate(parts[:5])]
        except ValueError:
            raise CheckFailed(f"invalid cron schedule in {line[:40]!r}") from None
        jobs.append(repr([schedule, parts[5].strip()]))
    return sorted(jobs)


def check_cron(spec):
    expected = sorted(
        repr([[expand_cron_field(f, i) for i, f in enumerate(job[:5])], job[5]]) for job in spec["expected"]
    )
    if parse_crontab(_read_text(spec["path"])) != expected:
        raise CheckFailed(f"{spec['path']}: the jobs are not what the task asks for")


# -- programs the agent wrote -----------------------------------------------------------------------------
def check_script_io(spec):
    """Run the agent's executable on inputs it never saw; stdout (trailing spaces ignored) and exit code."""
    import shutil
    import subprocess
    import tempfile

    script = os.path.abspath(spec["path"])
    if not os.path.isfile(script) or not os.access(script, os.X_OK):
        raise CheckFailed(f"{spec['path']}: missing or not executable")
    for number, case in enumerate(spec["cases"], 1):
        scratch = tempfile.mkdtemp(prefix="case-")
        try:
            for name, content in case.get("files", {}).items():
                with open(os.path.join(scratch, name), "w", encoding="utf-8") as handle:
                    handle.write(content)
            args = [arg.replace("{dir}", scratch) for arg in case.get("args", [])]
            try:
                done = subprocess.run(
                    [script, *args], input=case.get("stdin", "").encode(), capture_output=True, cwd=scratch,
                    timeout=spec.get("timeout", 10), env=_safe_env(), check=False,
                )
            except subprocess.TimeoutExpired:
                raise CheckFailed(f"{spec['path']}: hidden test {number} timed out") from None
            except OSError as exc:
                raise CheckFailed(f"{spec['path']}: cannot be executed ({exc.strerror})") from None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        output = done.stdout[:MAX_READ].decode("utf-8", "replace")
        if done.returncode != case.get("exit_code", 0):
            raise CheckFailed(f"{spec['path']}: hidden test {number} exited with status {done.returncode}")
        if "stdout" in case and _lines(output) != _lines(case["stdout"]):
            raise CheckFailed(f"{spec['path']}: hidden test {number} printed the wrong output")


def _run_test_file(source, suffix, command):
    import shutil
    import subprocess
    import tempfile

    scratch = tempfile.mkdtemp(prefix="test-")
    try:
        path = os.path.join(scratch, "test" + suffix)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(source)
        try:
            done = subprocess.run(
                [*command, path], stdin=subprocess.DEVNULL, capture_output=True, timeout=TEST_TIMEOUT_S,
                env=_safe_env(), check=False,
            )
        except subprocess.TimeoutExpired:
            raise CheckFailed("the task's test timed out") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-400:].decode("utf-8", "replace")
        raise CheckFailed(f"the task's test failed (exit status {done.returncode}): {tail}")


def check_bash_test(spec):
    _run_test_file(spec["source"], ".sh", ["bash"])


# Runs the test_* functions of a test file without pytest. It reads and deletes the file and makes itself
# non-dumpable first, so programs the tests start cannot read the tests' expected values.
PYTEST_LITE = '''
import ctypes, os, sys, traceback
namespace = {"__name__": "test_final_state"}
path = sys.argv[1]
with open(path, encoding="utf-8") as handle:
    source = handle.read()
os.unlink(path)
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
exec(compile(source, "test_final_state.py", "exec"), namespace)
tests = [name for name, value in namespace.items() if name.startswith("test") and callable(value)]
failed = 0
for name in tests:
    try:
        namespace[name]()
    except Exception:
        failed += 1
        print("FAILED", name)
        traceback.print_exc(limit=2)
sys.exit(1 if failed or not tests else 0)
'''


def check_python_tests(spec):
    """``test_*`` functions of a test_final_state.py (pytest style, without fixtures)."""
    import subprocess

    probe = subprocess.run([sys.executable, "-I", "-c", "import pytest"], capture_output=True, check=False)
    if probe.returncode == 0:
        command = [sys.executable, "-I", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", os.getcwd()]
    else:
        command = [sys.executable, "-I", "-c", PYTEST_LITE]
    _run_test_file(spec["source"], ".py", command)


# -- databases --------------------------------------------------------------------------------------------
def check_sqlite_query(spec):
    import sqlite3

    path = spec["db"]
    if not os.path.isfile(path):
        raise CheckFailed(f"{path}: missing")
    try:
        connection = sqlite3.connect(f"file:{os.path.abspath(path)}?mode=ro", uri=True)
        try:
            rows = [list(row) for row in connection.execute(spec["query"]).fetchall()]
        finally:
            connection.close()
    except sqlite3.Error:
        raise CheckFailed(f"{path}: the database does not have what the task asks for") from None
    if not _same_rows(rows, spec["expected"], spec.get("tol", 1e-6)):
        raise CheckFailed(f"{path}: the data is not what the task asks for")


# -- git --------------------------------------------------------------------------------------------------
def _git(repo, *args):
    import subprocess

    if not os.path.isdir(repo):
        raise CheckFailed(f"{repo}: missing repository")
    env = _safe_env(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null", GIT_TERMINAL_PROMPT="0")
    # Repository config is the agent's: switch off what could make these read-only commands run programs.
    command = ["git", "-c", "safe.directory=*", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null",
               "-c", "log.showSignature=false", "-c", "core.pager=cat", "-C", repo, *args]
    try:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=20, check=False)
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"{repo}: git timed out") from None
    if done.returncode != 0:
        raise CheckFailed(f"{repo}: git {args[0]} failed")
    return done.stdout.decode("utf-8", "replace")


def check_git_subjects(spec):
    """Commit subjects reachable from ``rev``, newest first: exactly ``equals`` or including ``includes``."""
    subjects = _lines(_git(spec["repo"], "log", "--format=%s", spec["rev"], "--"))
    if "equals" in spec and subjects != spec["equals"]:
        raise CheckFailed(f"{spec['repo']}: the history of {spec['rev']} is not what the task asks for")
    if any(subject not in subjects for subject in spec.get("includes", [])):
        raise CheckFailed(f"{spec['repo']}: {spec['rev']} lacks a required commit")


def check_git_file(spec):
    """A file's content in a commit (``content`` None: the file must not be in that commit)."""
    listing = _git(spec["repo"], "ls-tree", "--name-only", "-r", spec["rev"], "--", spec["path"])
    present = spec["path"] in _lines(listing)
    if spec["content"] is None:
        if present:
            raise CheckFailed(f"{spec['repo']}: {spec['path']} should not be committed in {spec['rev']}")
        return
    if not present:
        raise CheckFailed(f"{spec['repo']}: {spec['path']} is not committed in {spec['rev']}")
    if _git(spec["repo"], "cat-file", "blob", f"{spec['rev']}:{spec['path']}") != spec["content"]:
        raise CheckFailed(f"{spec['repo']}: {spec['path']} in {spec['rev']} has the wrong content")


def check_git_branch(spec):
    if _git(spec["repo"], "symbolic-ref", "--short", "HEAD").strip() != spec["branch"]:
        raise CheckFailed(f"{spec['repo']}: the checked-out branch is not the one the task asks for")


def check_git_tag(spec):
    repo, tag = spec["repo"], spec["tag"]
    if _git(repo, "cat-file", "-t", f"refs/tags/{tag}").strip() != ("tag" if spec.get("message") else "commit"):
        raise CheckFailed(f"{repo}: {tag} is missing or of the wrong kind")
    if _git(repo, "log", "-1", "--format=%s", f"{tag}^{{commit}}").strip() != spec["subject"]:
        raise CheckFailed(f"{repo}: {tag} points to the wrong commit")
    if spec.get("message") and _git(repo, "tag", "-l", "--format=%(contents:subject)", tag).strip() != spec["message"]:
        raise CheckFailed(f"{repo}: {tag} has the wrong message")


def check_git_no_tag(spec):
    if _git(spec["repo"], "tag", "-l", spec["tag"]).strip():
        raise CheckFailed(f"{spec['repo']}: the tag {spec['tag']} should not exist")


def check_git_hash_answer(spec):
    """The answer file holds the full hash of the one commit with ``subject``."""
    log = _lines(_git(spec["repo"], "log", "--all", "--format=%H %s"))
    hashes = [line.split(" ", 1)[0] for line in log if line.split(" ", 1)[1:] == [spec["subject"]]]
    if len(hashes) != 1:
        raise CheckFailed(f"{spec['repo']}: the commit in question is no longer unique")
    if _read_text(spec["path"]).strip() != hashes[0]:
        raise CheckFailed(f"{spec['path']}: not the hash of the commit in question")


CHECKS = {name[len("check_") :]: value for name, value in dict(globals()).items() if name.startswith("check_")}


# -- entry points -----------------------------------------------------------------------------------------
# Checks that run code the agent controls: its programs, or git, which repository config can make run more.
RUNS_AGENT_CODE = ("script_io", "bash_test", "python_tests", "git_")


def _harden():
    """Make this process non-dumpable: processes of the same uid (the agent's program, started by this very
    check) can then no longer read its memory through /proc/PID/mem, where the expected values are."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE = 4
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def run_checks(checks):
    """(passed, message): every check in order, stopping at the first failure."""
    if any(spec["kind"].startswith(RUNS_AGENT_CODE) for spec in checks):
        _harden()
    for spec in checks:
        try:
            CHECKS[spec["kind"]](spec)
        except CheckFailed as failure:
            return False, str(failure)
        except Exception as exc:  # a check crashing on odd agent output is a failure, not an env error
            return False, f"{spec['kind']}: {type(exc).__name__}"
    return True, "all checks passed"


def set_up(payload):
    """Write the initial files, run the setup script, and pin every mtime for reproducible listings."""
    import base64
    import shutil
    import subprocess
    import tempfile

    for rel, entry in payload["files"].items():
        directory = os.path.dirname(rel)
        if directory:
            os.makedirs(directory, exist_ok=True)
        data = base64.b64decode(entry["b64"]) if "b64" in entry else entry["text"].encode("utf-8")
        with open(rel, "wb") as handle:
            handle.write(data)
    if payload["script"].strip():
        scratch = tempfile.mkdtemp(prefix="setup-")
        script = os.path.join(scratch, "setup.sh")
        with open(script, "w", encoding="utf-8") as handle:
            handle.write(payload["script"])
        stamp = f"@{FIXED_EPOCH} +0000"
        env = _safe_env(
            GIT_AUTHOR_DATE=stamp, GIT_COMMITTER_DATE=stamp, GIT_AUTHOR_NAME="Dev", GIT_AUTHOR_EMAIL="dev@example.com",
            GIT_COMMITTER_NAME="Dev", GIT_COMMITTER_EMAIL="dev@example.com", GIT_CONFIG_NOSYSTEM="1",
        )
        try:
            done = subprocess.run(
                ["bash", "-e", script], stdin=subprocess.DEVNULL, capture_output=True, env=env,
                timeout=payload.get("timeout", 60), check=False,
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if done.returncode != 0:
            tail = (done.stdout + done.stderr)[-2000:].decode("utf-8", "replace")
            return False, f"setup script failed with status {done.returncode}: {tail}"
    for directory, dirnames, filenames in os.walk("."):
        for name in dirnames + filenames:
            os.utime(os.path.join(directory, name), (FIXED_EPOCH, FIXED_EPOCH), follow_symlinks=False)
    return True, "ready"


def _main(payload):
    """Entry point: ``payload`` is a literal dict (mode, key, and the files and script or the checks)."""
    try:
        passed, message = set_up(payload) if payload["mode"] == "setup" else run_checks(payload["checks"])
    except Exception:
        import traceback

        passed, message = False, "runner error: " + traceback.format_exc(limit=3)[-1500:]
    import hashlib
    import hmac

    line = f"{int(passed)} {message!r}"
    tag = hmac.new(bytes.fromhex(payload["key"]), line.encode(), hashlib.sha256).hexdigest()
    sys.stdout.flush()
    print(f"\nRLLM-RESULT {tag} {line}")
