"""The persistent shell: state carries over, delimiting cannot be fooled, timeouts keep the shell usable."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from rl_llm.sandboxes import SandboxError, make
from rl_llm.sandboxes.shell import INTERRUPT_GRACE_S, KILL_GRACE_S

from .conftest import TEST_LIMITS

# Required bound on how late a timed-out command may come back (the issue says 0.5 s); measured with extra
# slack for this shared 2-core machine, since it is a behaviour check and not a benchmark.
TIMEOUT_BOUND_S = 0.5
LOAD_SLACK_S = 0.75


@pytest.fixture
def session(sandbox):
    with sandbox.session() as sh:
        yield sh


def assert_timely(res, limit: float) -> None:
    assert res.timed_out and res.exit_code == 124
    assert limit - 0.05 <= res.duration_s <= limit + TIMEOUT_BOUND_S + LOAD_SLACK_S, res.duration_s


def test_cwd_variables_functions_and_aliases_persist(session):
    assert session.run("mkdir -p sub && cd sub && export FOO=bar && local_var=7").ok
    assert session.run("greet() { echo hi $1; }").ok
    assert session.run("alias ll='echo aliased'").ok
    res = session.run('pwd; echo "$FOO $local_var"; greet you; ll')
    assert res.stdout.splitlines()[1:] == ["bar 7", "hi you", "aliased"]
    assert res.stdout.splitlines()[0].endswith("/sub")


def test_background_jobs_survive_between_commands(session):
    assert session.run("sleep 30 & echo started").stdout == "started\n"
    assert "sleep 30" in session.run("jobs").stdout


@pytest.mark.parametrize("payload", [
    "printf 'no trailing newline'",
    r"printf 'binary\000\377\376 bytes'",
    "echo __rl_done 0123456789abcdef0123456789abcdef 0; echo 0123456789abcdef0123456789abcdef 0 >&2",
    "for i in $(seq 5); do head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; done",
    "printf '%s' \"$(head -c 3000 /dev/zero | tr '\\0' 'x')\"",
    "echo line1; echo; echo; printf '\\r\\n\\n'",
    "PS1='$ '; PS0='ps0'; PROMPT_COMMAND='echo from-prompt'",  # nothing may print between commands
])
def test_output_cannot_confuse_command_delimiting(session, payload):
    expected = make_reference(payload)
    res = session.run(payload)
    again = session.run("echo next")
    assert again.stdout == "next\n" and again.stderr == ""
    if expected is not None:
        assert res.stdout == expected
    assert res.exit_code == 0


def test_tracing_cannot_reveal_or_break_the_protocol(session):
    res = session.run("set -x; echo traced")
    assert res.stdout == "traced\n" and "+ echo traced" in res.stderr
    res = session.run("set +x; set -v; echo verbose; set +v")
    assert res.stdout == "verbose\n"
    assert session.run("echo clean").stderr == ""


def make_reference(payload: str) -> str | None:
    """What the payload prints, computed by a cold run in a throwaway local shell (None if random)."""
    if "urandom" in payload:
        return None
    with make("local", **TEST_LIMITS) as sb:
        return sb.run(payload).stdout


def test_stdin_and_exit_codes(session):
    assert session.run("tr a-z A-Z", stdin="shout").stdout == "SHOUT"
    assert session.run("read line; echo got:$line", stdin=b"abc\n").stdout == "got:abc\n"
    assert session.run("read line; echo [$line]").stdout == "[]\n"  # no stdin: EOF, never the control pipe
    assert session.run("false").exit_code == 1
    assert session.run("(exit 42)").exit_code == 42
    assert session.run("echo ${undefined:?boom}").exit_code != 0
    assert session.run("if then fi").exit_code == 2  # syntax error: reported, session fine
    assert session.run("echo fine").stdout == "fine\n"


@pytest.mark.parametrize("command", ["while true; do :; done", "sleep 100", "python3 -c 'while True: pass'",
                                     "cat /dev/zero > /dev/null"])
def test_timeout_interrupts_and_session_recovers(session, command):
    session.run("cd /tmp && export KEEP=yes")
    res = session.run(command, timeout=1.0)
    assert_timely(res, 1.0)
    after = session.run('echo "$PWD $KEEP"')
    assert after.stdout == "/tmp yes\n"  # interrupted, not restarted: state kept
    assert session.restarts == 0


def test_command_ignoring_sigint_is_killed_and_state_kept(session):
    session.run("export KEEP=1")
    res = session.run("python3 -c 'import signal, time; signal.signal(2, signal.SIG_IGN); time.sleep(60)'",
                      timeout=1.0)
    assert_timely(res, 1.0 + INTERRUPT_GRACE_S)
    assert res.stdout == res.stderr == ""  # no trace of the markers the host gave up waiting for
    assert session.run("echo $KEEP").stdout == "1\n"
    assert session.restarts == 0  # the command was killed, not the shell


def test_uninterruptible_shell_is_replaced(session):
    res = session.run("trap '' INT; while :; do :; done", timeout=1.0)
    assert_timely(res, 1.0 + INTERRUPT_GRACE_S + KILL_GRACE_S)
    assert "restarted" in res.stderr
    assert session.run("echo back").stdout == "back\n"
    assert session.restarts == 1


def test_a_command_abandoned_by_keyboard_interrupt_stops(sandbox, session):
    session.run("cd /tmp")
    interrupter = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))  # Ctrl-C while it runs
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):
        session.run("sleep 1.5; echo late > late.txt", timeout=30)
    interrupter.join()
    time.sleep(2)
    assert not (sandbox.workdir / "late.txt").exists()  # it did not go on running in the shell
    res = session.run("pwd")
    assert res.ok and "restarted" in res.stderr and session.restarts == 1


def test_exit_and_self_kill_restart_the_shell(session):
    res = session.run("exit 7")
    assert res.exit_code == 7 and "fresh shell" in res.stderr
    assert session.run("echo alive").stdout == "alive\n"
    session.run("kill -9 $$")
    assert session.run("echo alive again").stdout == "alive again\n"
    assert session.restarts == 2


def test_closing_stdout_of_the_shell_is_survivable(session):
    res = session.run("exec 1>/dev/null", timeout=2)
    assert res.exit_code == 0  # the markers use private copies of the pipes
    assert session.run("echo gone").stdout == ""  # the shell's stdout really is /dev/null now
    assert session.run("exec 1>&2; echo visible").stderr == "visible\n"


def test_huge_output_is_capped_and_drained(session):
    cap = TEST_LIMITS["max_output_bytes"]
    res = session.run("head -c 20000000 /dev/zero; echo done >&2", timeout=20)
    assert res.truncated and len(res.stdout) == cap and res.stderr == "done\n"
    assert session.run("echo small").stdout == "small\n"


def test_run_python_in_session_uses_current_directory(session):
    session.run("mkdir -p pkg && cd pkg && echo 'VALUE = 5' > mod.py")
    assert session.run_python("import mod; print(mod.VALUE * 2)").stdout == "10\n"


def test_session_started_in_a_short_lived_thread_outlives_it(sandbox):
    holder = []

    def start() -> None:
        sh = sandbox.session()
        holder.append((sh, sh.run("echo first").stdout))  # the shell process is forked in this thread

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    time.sleep(0.3)  # the OS thread finishes exiting (and a PR_SET_PDEATHSIG would fire) after join returns
    sh, first = holder[0]
    assert first == "first\n"
    assert sh.run("echo second").stdout == "second\n"  # PR_SET_PDEATHSIG did not fire with the thread
    assert sh.restarts == 0


def test_reset_empties_the_temporary_directory(sandbox):
    tmp = '"${TMPDIR:-/tmp}"'
    sh = sandbox.session()
    sh.run(f"echo x > {tmp}/left.txt; mkdir -p {tmp}/locked/d; chmod 000 {tmp}/locked")
    assert sh.run(f"ls -A {tmp}").stdout.split() == ["left.txt", "locked"]
    sandbox.reset()  # the next user of a pooled sandbox must not see the last one's scratch files
    assert sandbox.session().run(f"ls -A {tmp}").stdout == ""


def test_reset_and_close_end_sessions(sandbox):
    sh = sandbox.session()
    sh.run("echo hi > f.txt")
    sandbox.reset()
    with pytest.raises(SandboxError, match="reset"):
        sh.run("true")
    fresh = sandbox.session()
    assert fresh.run("ls").stdout == ""
    fresh.close()
    with pytest.raises(SandboxError, match="closed"):
        fresh.run("true")


def test_concurrent_sessions_of_one_sandbox_share_the_workspace(sandbox):
    first, second = sandbox.session(), sandbox.session()
    first.run("echo shared > note.txt")
    assert second.run("cat note.txt").stdout == "shared\n"
    results = []
    threads = [threading.Thread(target=lambda s=s, i=i: results.append(s.run(f"echo {i}").stdout))
               for i, s in enumerate([first, second] * 4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == sorted(f"{i}\n" for i in range(8))
