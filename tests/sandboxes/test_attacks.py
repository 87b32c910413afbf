"""The attack suite: every attack is contained, reported in the ExecResult, and followed by a check that the
host is intact and the sandbox still works. Isolation attacks run on the isolating backends (bwrap, docker);
resource attacks run on every backend, `local` included (it has rlimits but no isolation, by design)."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_llm.sandboxes import Sandbox, SandboxError, SandboxPathError, make
from rl_llm.sandboxes.workspace import running_as_root

from .conftest import TEST_LIMITS, processes_of_uid, require_backend

REPO = Path(__file__).resolve().parents[2]
PROTECTED = [REPO / "pyproject.toml", Path("/etc/hostname"), Path("/etc/passwd"), Path("/usr/bin/env")]
_DIGESTS = {path: hashlib.sha256(path.read_bytes()).hexdigest() for path in PROTECTED if path.exists()}
MIB = 1024 * 1024


def assert_host_intact(sb: Sandbox, canary: Path | None = None) -> None:
    for path, digest in _DIGESTS.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, f"{path} changed"
    for planted in (REPO / "PWNED", Path("/PWNED"), Path("/usr/bin/PWNED"), Path("/tmp/PWNED")):
        assert not planted.exists(), f"{planted} was created on the host"
    if canary is not None:
        assert canary.read_text() == "host secret 7f3a"
    assert sb.run("echo alive").stdout == "alive\n"  # the sandbox itself still works


def assert_no_processes_left(sb: Sandbox) -> None:
    if running_as_root():
        deadline = time.monotonic() + 3
        while processes_of_uid(sb._workspace.uid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_of_uid(sb._workspace.uid) == []


# -- reading and writing outside the workspace ------------------------------------------------------------
def test_cannot_read_host_home_checkout_or_secrets(isolated, canary):
    home_entries = [p.name for p in Path.home().iterdir()][:20]
    for command in [f"cat {canary}", f"cat {REPO / 'pyproject.toml'}", f"ls -A {REPO}", "cat /etc/shadow",
                    "cat ../../../../../../etc/shadow", f"ls -A {Path.home()}", f"ls -A {canary.parent}"]:
        res = isolated.run(command)
        assert res.exit_code != 0, (command, res)
        assert "host secret" not in res.output and "rl-llm" not in res.stdout
    listing = isolated.run("ls -A /; ls -A /tmp /etc").stdout.split()
    assert not {"work", "root", "home"} & set(listing)
    assert not set(home_entries) & set(isolated.run("ls -A ~ /root 2>/dev/null").stdout.split())
    assert_host_intact(isolated, canary)


def test_cannot_write_outside_workspace(isolated, canary):
    for command in ["echo x > /etc/passwd", "echo x >> /etc/hostname", "touch /usr/bin/PWNED", "mkdir /PWNED",
                    f"echo x > {REPO}/PWNED", f"echo pwned > {canary}", "touch /PWNED", "rm -f /usr/bin/env"]:
        res = isolated.run(command)
        assert res.exit_code != 0, (command, res)
    assert isolated.run("echo private > /tmp/PWNED && cat /tmp/PWNED").stdout == "private\n"  # its own /tmp
    assert_host_intact(isolated, canary)


def test_no_controlling_terminal_to_inject_into(isolated):
    # With a terminal, TIOCSTI on /dev/tty would type commands into the user's shell (CVE-2017-5226).
    res = isolated.run_python("import os\ntry:\n    os.open('/dev/tty', os.O_RDWR)\n    print('OPENED')\n"
                              "except OSError as exc:\n    print('REFUSED', exc.errno)")
    assert res.stdout.startswith("REFUSED"), res
    assert isolated.run("ls -A /dev/pts 2>/dev/null; ls /dev/console 2>/dev/null").stdout == ""
    assert isolated.run_python("import os; os.openpty()").exit_code != 0  # and none can be made
    assert_host_intact(isolated)


# -- network -------------------------------------------------------------------------------------------------
class RecordingServer:
    """A TCP server on 127.0.0.1 that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.sendall(b"hello from the host\n")
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def server() -> Iterator[RecordingServer]:
    srv = RecordingServer()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=2) as probe:  # the server really works
        assert probe.recv(100) == b"hello from the host\n"
    deadline = time.monotonic() + 2
    while srv.accepted != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    srv.accepted = 0
    yield srv
    srv.close()


CONNECT = ("import socket, sys\ntry:\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
           "    print('CONNECTED', s.recv(100))\nexcept OSError as exc:\n    print('BLOCKED', exc)\n")


def test_no_network_to_a_host_server(isolated, server):
    res = isolated.run_python(CONNECT.format(port=server.port))
    assert res.stdout.startswith("BLOCKED"), res
    res = isolated.run(f"exec 3<>/dev/tcp/127.0.0.1/{server.port} && echo CONNECTED")
    assert res.exit_code != 0 and "CONNECTED" not in res.stdout
    res = isolated.run_python("import socket; print(socket.getaddrinfo('example.com', 80))")
    assert res.exit_code != 0  # no DNS either
    time.sleep(0.1)
    assert server.accepted == 0
    assert_host_intact(isolated)


def test_network_option_really_opens_the_network(server):
    require_backend("bwrap")  # docker's bridge network has its own loopback, so only bwrap can show this
    with make("bwrap", **{**TEST_LIMITS, "network": True}) as sb:
        res = sb.run_python(CONNECT.format(port=server.port))
    assert res.stdout.startswith("CONNECTED"), res
    assert server.accepted == 1


# -- symlinks and hard links -------------------------------------------------------------------------------
def test_symlink_tricks_do_not_leave_the_workspace(isolated, canary):
    setup = f"ln -s /etc/passwd passwd_link; ln -s {canary} canary_link; ln -s / rootlink; ln -s .. up"
    assert isolated.run(setup).ok
    assert "host secret" not in isolated.run("cat canary_link up/../..{canary} rootlink{canary}").output
    for path in ["passwd_link", "canary_link", "rootlink/etc/passwd", "up/workspace/x", f"rootlink{canary}"]:
        with pytest.raises(SandboxPathError):
            isolated.read_file(path)
    for path in ["rootlink/tmp/PWNED", "up/PWNED", f"rootlink{REPO}/PWNED"]:
        with pytest.raises(SandboxPathError):
            isolated.write_file(path, "x")
    isolated.write_file("canary_link", "replaced")  # replaces the link itself, never writes through it
    assert isolated.read_file("canary_link") == b"replaced"
    res = isolated.run(f"ln {canary} hard; ln /etc/hostname hard2; ln /usr/bin/env hard3")
    assert res.exit_code != 0 and not (isolated.workdir / "hard").exists()
    assert_host_intact(isolated, canary)


# -- killing its parent, leaving processes behind ----------------------------------------------------------
def test_killing_its_parent_is_contained(backend, canary):
    if backend == "local" and not running_as_root():
        pytest.skip("the unsafe local backend runs as the caller's own uid, so it could kill the test runner")
    with make(backend, **TEST_LIMITS) as sb:
        res = sb.run("kill -9 $PPID; kill -9 1; kill -KILL -1; echo survived")
        assert res.duration_s < 5
        with sb.session() as sh:
            sh.run("kill -9 $PPID; kill -KILL -1; kill -9 1")
            assert sh.run("echo session fine").stdout == "session fine\n"
        assert_host_intact(sb, canary)


def test_a_commands_stdin_cannot_be_read_by_the_programs_it_runs(isolated):
    """A command's stdin (the Terminal-v0 checker: its expected values and the key of its verdict) is read by
    the command alone. The docker backend handed it in as a file in the read-only io directory, which every
    program of the sandbox could read while the command ran: a program the checker starts read it there."""
    secret = "stdin-secret-" + "7" * 16
    program = ("import subprocess, sys; data = sys.stdin.read(); "
               "probe = 'cat /run/rl-io/* /proc/[0-9]*/fd/0 2>/dev/null; echo probed'; "
               "print(len(data), subprocess.run(['sh', '-c', probe], capture_output=True, text=True).stdout)")  # fmt: skip
    result = isolated.run(["python3", "-c", program], stdin=secret + "\n")
    assert result.exit_code == 0 and result.stdout.startswith(f"{len(secret) + 1} ")
    assert "probed" in result.stdout and secret not in result.stdout
    big = "x" * 3_000_000  # more than a socket or pipe buffer holds: fed while the output is read
    assert isolated.run("wc -c", stdin=big).stdout.strip() == "3000000"
    assert isolated.run("cat", timeout=5).stdout == ""  # no stdin: EOF at once, not a wait
    assert isolated.run("sleep 0.2; echo ignored it", stdin=big).stdout == "ignored it\n"  # a command that never reads


def test_background_processes_do_not_outlive_the_command(sandbox):
    res = sandbox.run("sleep 300 & setsid sleep 301 & nohup sleep 302 >/dev/null 2>&1 & (sleep 303 &); "
                      "echo launched", timeout=10)
    assert res.stdout == "launched\n" and res.duration_s < 5  # did not wait for the sleeps
    if sandbox.backend != "bwrap":
        sandbox.kill_processes()  # setsid escapes the command's process group (the documented limit)
    assert_no_processes_left(sandbox)
    assert_host_intact(sandbox)


def detached(command: str, name: str, where: str = "$TMPDIR") -> str:
    """Shell code starting `command` in a session of its own (out of reach of process-group kills), and
    waiting until it is: otherwise the group kill after a one-off command could catch it before its setsid."""
    ready = f'"{where}/ready-{name}"'
    return (f"setsid sh -c 'touch {ready}; {command}' >/dev/null 2>&1 & "
            f"while [ ! -e {ready} ]; do sleep 0.01; done")


def test_kill_processes_ends_detached_processes_and_keeps_the_workspace(sandbox):
    sandbox.write_file("kept.txt", "still here")
    session = sandbox.session()
    session.run(detached("sleep 1; echo late > from-session.txt", "session") + "; sleep 300 &")
    sandbox.run(detached("sleep 1; echo late > from-run.txt", "run"))
    sandbox.kill_processes()
    with pytest.raises(SandboxError, match="killed"):
        session.run("true")  # sessions end too
    assert_no_processes_left(sandbox)
    time.sleep(1.5)
    assert sorted(path.name for path in sandbox.workdir.iterdir()) == ["kept.txt"]  # nothing wrote late
    with sandbox.session() as fresh:
        assert fresh.run("cat kept.txt").stdout == "still here"
    assert_host_intact(sandbox)


def test_local_without_root_finds_its_processes_by_their_environment(monkeypatch):
    # Not root: no private uid to kill by, so the local backend recognises its processes by an environment
    # entry unique to the sandbox. (Running as root here, commands still run as the slot uid; only how the
    # backend finds them changes.)
    monkeypatch.setattr("rl_llm.sandboxes.local.running_as_root", lambda: False)
    sb = make("local", **TEST_LIMITS)
    marker = sb._marker.encode()

    def marked() -> list[str]:
        found = []
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if entry.name.isdigit() and marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(entry.name)
        return found

    sb.run(detached("sleep 300", "first", where="."))  # (the patch also left the private TMPDIR root's)
    assert marked()
    sb.kill_processes()
    assert marked() == []
    sb.run(detached("sleep 301", "second", where="."))
    assert marked()
    sb.close()
    assert marked() == []


# -- resources ---------------------------------------------------------------------------------------------
def test_fork_bomb_is_contained_and_the_process_limit_binds(sandbox):
    if sandbox.backend == "local" and not running_as_root():
        pytest.skip("RLIMIT_NPROC of the local backend counts every process of the caller's uid")
    counter = ("import os, time\nn = 0\ntry:\n    while n < 1000:\n        if os.fork() == 0:\n"
               "            time.sleep(3); os._exit(0)\n        n += 1\nexcept OSError as exc:\n"
               "    print(n, exc.errno)\n")
    res = sandbox.run_python(counter, timeout=10)
    forked, errno_value = map(int, res.stdout.split())
    assert 0 < forked < TEST_LIMITS["max_processes"] and errno_value == 11  # EAGAIN: the limit is real
    res = sandbox.run(":(){ :|:& };:", timeout=3)
    assert res.duration_s < 3 + 1.5
    sandbox.reset()
    assert_no_processes_left(sandbox)
    assert_host_intact(sandbox)


def test_memory_bomb_fails_inside(sandbox):
    res = sandbox.run_python("b = bytearray(4 * 1024 ** 3)")
    assert res.exit_code != 0 and "MemoryError" in res.stderr
    res = sandbox.run_python("x = []\nwhile True:\n    x.append(bytearray(10 ** 7))", timeout=10)
    assert res.exit_code != 0 and not res.timed_out and "MemoryError" in res.stderr
    assert_host_intact(sandbox)


def test_disk_filling_write_stops_at_the_file_size_limit(sandbox):
    res = sandbox.run("head -c 100M /dev/zero > big", timeout=10)
    assert res.exit_code != 0
    assert (sandbox.workdir / "big").stat().st_size <= TEST_LIMITS["max_file_size_mb"] * MIB
    assert_host_intact(sandbox)


def test_private_tmp_is_size_capped(isolated):
    res = isolated.run("for i in 1 2 3 4; do head -c 7M /dev/zero > /tmp/f$i || exit 9; done", timeout=10)
    assert res.exit_code == 9 and "No space left" in res.stderr
    assert_host_intact(isolated)


def test_infinite_loop_times_out_promptly(sandbox):
    res = sandbox.run("while true; do :; done", timeout=1.0)
    assert res.timed_out and res.exit_code == 124
    assert 1.0 <= res.duration_s <= 1.0 + 0.5 + 0.75  # 0.5 s required; the rest is slack for a loaded host
    assert_no_processes_left(sandbox)
    assert_host_intact(sandbox)


def test_cpu_time_limit_kills_a_spinning_process():
    with make("local" if require_local_only() else "bwrap", **{**TEST_LIMITS, "cpu_time": 1}) as sb:
        res = sb.run_python("while True: pass", timeout=20)
        assert not res.timed_out and res.exit_code in (137, 152)  # SIGKILL or SIGXCPU
        assert_host_intact(sb)


def require_local_only() -> bool:
    """True when bwrap cannot run (then the rlimit is shown on the local backend instead)."""
    from rl_llm.sandboxes import backend_problem

    return backend_problem("bwrap") is not None


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_hundred_megabytes_of_output_is_capped_without_deadlock(sandbox, stream):
    redirect = ">&2" if stream == "stderr" else ""
    res = sandbox.run(f"head -c 100000000 /dev/zero {redirect}; echo end", timeout=30)
    captured = getattr(res, stream)
    assert res.truncated and not res.timed_out and res.exit_code == 0
    assert len(captured) == TEST_LIMITS["max_output_bytes"]
    assert res.stdout.endswith("end\n") if stream == "stderr" else res.stderr == ""
    assert_host_intact(sandbox)
