"""A persistent bash inside a sandbox, driven over pipes with unforgeable per-command markers.

Protocol: the host writes each command, and a fresh NONCE (128 random bits), to files in the sandbox's
read-only io directory and sends the driver one line, `. CMD_FILE <STDIN; __rl_done $? NONCE_FILE`. When
the command returns, the driver prints NONCE on stdout and on stderr (so the host knows where each stream's
output ends, even without a trailing newline) and writes `NONCE STATUS` to a separate status pipe. No output,
binary or not, can fake the end of a command, and the nonce is never part of a command line that tracing
could echo. Bash runs interactive (`-i`) because only then does SIGINT abort the
running command line, builtin loops included, and return to reading input, like Ctrl-C in a terminal.
Sourcing the command from a file keeps bash's own job notices out of the output and reads the bytes exactly.

Timeouts: SIGINT to the driver and its descendants, then SIGKILL to the descendants, then a fresh shell.
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import os
import secrets
import shlex
import subprocess
import threading
import time
import weakref
from typing import TYPE_CHECKING

from rl_llm.sandboxes.base import (
    NOTE,
    TIMEOUT_EXIT_CODE,
    Command,
    ExecResult,
    SandboxError,
    SandboxLimits,
    Stdin,
    as_bytes,
    command_text,
    python_argv,
)
from rl_llm.sandboxes.processes import (
    close_fds,
    descendants,
    exit_status,
    kill_group,
    owned_pipe,
    send,
    spawn_long_lived,
)
from rl_llm.sandboxes.streams import FdPump, StreamCapture

if TYPE_CHECKING:
    from rl_llm.sandboxes.base import Sandbox

DRIVER_ARGV = ["/bin/bash", "--noprofile", "--norc", "--noediting", "-i"]
STARTUP_TIMEOUT_S = 20.0
INTERRUPT_GRACE_S = 0.15  # after SIGINT, before SIGKILL of the command's processes
KILL_GRACE_S = 0.25  # after SIGKILL, before giving up on the shell and starting a new one


def driver_setup(limits: SandboxLimits, workdir: str, status_fd: int | None) -> bytes:
    """Bash run once at startup: quiet interactive mode, private marker fds, the limits, the workspace."""
    status = f"61>&{status_fd} {status_fd}>&-" if status_fd is not None else "61>&1"
    return (
        "set +o history +H; PS1= PS2= PS0=; unset PROMPT_COMMAND MAILCHECK HISTFILE\n"
        f"exec {status} 62>&1 63>&2\n"
        # __rl_done STATUS NONCE_FILE: the nonce is read from a file so that it never appears in a command
        # line (where `set -x` or `set -v` would print it); tracing is paused while it runs, and prompts the
        # user may have set are cleared so nothing is printed between commands. A file already gone belongs
        # to a marker the host stopped waiting for (an interrupted command): then nothing is printed at all.
        "__rl_done() { { local __rl_x=$- __rl_n; set +x; } 2>/dev/null; "
        "if { read -r __rl_n <\"$2\"; } 2>/dev/null; then printf %s \"$__rl_n\" >&62; printf %s \"$__rl_n\" >&63; "
        "printf '%s %s\\n' \"$__rl_n\" \"$1\" >&61; fi; "
        "PS0= PS1= PS2= PROMPT_COMMAND=; [[ $__rl_x != *x* ]] || set -x; }\n"
        f"{limits.ulimit_command()} || exit 125\n"
        f"cd {shlex.quote(workdir)} || exit 125\n"
    ).encode()


class ShellProcess(abc.ABC):
    """One running driver shell, as a backend provides it (see `PopenShell`)."""

    stdin_fd: int
    stdout_fd: int
    stderr_fd: int
    status_fd: int | None  # None: the status line follows the marker on stdout

    @abc.abstractmethod
    def interrupt(self, hard: bool) -> None:
        """soft: SIGINT to the shell and its descendants; hard: SIGKILL to the descendants only."""

    @abc.abstractmethod
    def terminate(self) -> None:
        """End the shell and everything it started, and reap it, leaving the pipes open. Idempotent."""

    @abc.abstractmethod
    def close_pipes(self) -> None:
        """Close the host ends of the shell's pipes."""

    def kill(self) -> None:
        self.terminate()
        self.close_pipes()

    @abc.abstractmethod
    def exit_code(self, wait: float = 0.0) -> int | None:
        """The shell's exit status once it has ended, else None."""

    def has_background(self) -> bool:
        """Whether processes besides the shell run (a background job, a detached daemon), for the workspace
        quota's watcher; True where a backend cannot tell cheaply."""
        return True


class PopenShell(ShellProcess):
    """A driver shell that is a local child process (the bwrap and local backends), with raw pipe fds."""

    def __init__(self, proc: subprocess.Popen[bytes], fds: tuple[int, int, int, int], setup: bytes) -> None:
        self.proc = proc
        self.stdin_fd, self.stdout_fd, self.stderr_fd, self.status_fd = fds
        self._closed = False
        self._close_lock = threading.Lock()
        with contextlib.suppress(BrokenPipeError):  # died at once: the startup sync reports why
            os.write(self.stdin_fd, setup)

    def driver_pid(self) -> int | None:
        """Host pid of the bash driver (the child process itself unless a backend wraps it)."""
        return self.proc.pid

    def interrupt(self, hard: bool) -> None:
        driver = self.driver_pid()
        if driver is None:
            return
        tree = descendants(driver)
        send(tree if hard else [driver, *tree], 9 if hard else 2)

    def terminate(self) -> None:
        kill_group(self.proc)

    def close_pipes(self) -> None:
        with self._close_lock:  # closing a number twice could close another thread's new fd
            if self._closed:
                return
            self._closed = True
        close_fds(self.stdin_fd, self.stdout_fd, self.stderr_fd, self.status_fd)

    def exit_code(self, wait: float = 0.0) -> int | None:
        try:
            code = self.proc.wait(wait) if wait else self.proc.poll()
        except subprocess.TimeoutExpired:
            return None
        return None if code is None else exit_status(code)


class _Box:
    """Holds the live shell so a finalizer can kill it without keeping the session alive."""

    def __init__(self) -> None:
        self.shell: ShellProcess | None = None
        self._lock = threading.Lock()

    def kill(self) -> None:
        with self._lock:
            shell, self.shell = self.shell, None
        if shell is not None:
            shell.kill()


class ShellSession:
    """A persistent bash in a sandbox: cwd, variables, functions and background jobs carry over.

    `run(cmd, timeout, stdin)` returns an `ExecResult` like `Sandbox.run`. A command that passes its timeout
    is interrupted and the shell stays usable (`timed_out=True`, exit code 124). If the shell itself ends
    (`exit`, killed), the next command starts a fresh one and says so in its stderr. Thread-safe (one command
    at a time); ends at `close()`, or when its sandbox is reset or closed.
    """

    def __init__(self, sandbox: Sandbox, shell: ShellProcess | None = None) -> None:
        self._sandbox = sandbox
        self._lock = threading.Lock()
        self._box = _Box()
        self._closed_reason: str | None = None
        self._pump: FdPump | None = None
        self._ready = False
        self._notes: list[str] = []
        self._status = bytearray()
        self._out: StreamCapture | None = None
        self._err: StreamCapture | None = None
        self._carry_out = self._carry_err = b""
        self.restarts = 0
        self._finalizer = weakref.finalize(self, self._box.kill)
        if shell is not None:
            self._attach(shell)

    @property
    def closed(self) -> bool:
        return self._closed_reason is not None

    def run(self, cmd: Command, timeout: float | None = None, stdin: Stdin = None) -> ExecResult:
        text = command_text(cmd)
        limit = self._sandbox._timeout(timeout)
        data = None if stdin is None else as_bytes(stdin, "stdin")
        # The quota check runs after the lock is released: a quota stop restarts this session too.
        return self._sandbox._quota.guard(lambda: self._run_locked(text, limit, data))

    def _run_locked(self, text: str, limit: float, data: bytes | None) -> ExecResult:
        with self._lock:
            self._check_open()
            self._ensure_shell()
            files = [self._sandbox.put_io_file("cmd", text.encode())]
            if data is not None:
                files.append(self._sandbox.put_io_file("stdin", data))
            try:
                source = shlex.quote(files[0][1])
                feed = shlex.quote(files[1][1]) if data is not None else "/dev/null"
                return self._execute(f". {source} <{feed}", limit)
            except BaseException:  # e.g. KeyboardInterrupt while waiting: the command must not run on
                self._detach()
                self.restarts += 1
                self._notes.append(f"\n{NOTE}the previous command was abandoned, so the shell was restarted; "
                                   "its working directory and variables were reset\n")
                raise
            finally:
                for host, _ in files:
                    host.unlink(missing_ok=True)

    def run_python(self, code: str, timeout: float | None = None, stdin: Stdin = None) -> ExecResult:
        """Run a Python snippet with `python3` in the session's current directory and environment."""
        with self._lock:
            self._check_open()
        host, inner = self._sandbox.put_io_file("snippet", as_bytes(code, "code"))
        try:
            return self.run(python_argv(inner), timeout=timeout, stdin=stdin)
        finally:
            host.unlink(missing_ok=True)

    def close(self) -> None:
        self._end("the session was closed")

    def __enter__(self) -> ShellSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _restart(self, reason: str) -> None:
        """End the shell and all it started, keeping the session open (a workspace quota stop): a command in
        flight returns at once, saying the shell exited; the next command starts a fresh shell."""
        killed: ShellProcess | None = None
        wait = 0.0
        # A command in flight notices its shell die, notes it and detaches; if it was just starting a shell,
        # that one is killed on the next round.
        while not self._lock.acquire(timeout=wait):
            wait = 0.1
            shell = self._box.shell
            if shell is not None and shell is not killed:
                shell.terminate()
                killed = shell
        try:
            if self._box.shell is not None and self._closed_reason is None:
                self._detach()
                self.restarts += 1
                self._notes.append(f"\n{NOTE}{reason}, so the shell was restarted; its working directory and "
                                   "variables were reset\n")
        finally:
            self._lock.release()

    def _has_background(self) -> bool:
        shell = self._box.shell
        return shell is not None and shell.has_background()

    def _end(self, reason: str) -> None:
        if self._closed_reason is None:
            self._closed_reason = reason
        if not self._lock.acquire(blocking=False):
            shell = self._box.shell
            if shell is not None:
                shell.terminate()  # a command is running: its shell dies, so it returns promptly
            self._lock.acquire()
        try:
            self._detach()
        finally:
            self._lock.release()

    # -- shell lifecycle ----------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed_reason is not None:
            raise SandboxError(f"shell session is closed: {self._closed_reason}")

    def _attach(self, shell: ShellProcess) -> None:
        self._box.shell = shell
        self._pump = pump = FdPump()
        pump.add(shell.stdout_fd, lambda data: self._out.on_read(data) if self._out else None)
        pump.add(shell.stderr_fd, lambda data: self._err.on_read(data) if self._err else None)
        if shell.status_fd is not None:
            pump.add(shell.status_fd, self._status.extend)
        self._ready = False
        self._status.clear()
        self._carry_out = self._carry_err = b""

    def _detach(self) -> None:
        if self._pump is not None:
            self._pump.close()
            self._pump = None
        self._box.kill()
        self._ready = False

    def _ensure_shell(self) -> None:
        if self._box.shell is None:
            self._attach(self._sandbox.spawn_shell())
        if self._ready:
            return
        result = self._sync(time.monotonic() + STARTUP_TIMEOUT_S, fresh=True)
        if result is None:
            shell = self._box.shell
            code = shell.exit_code(1.0) if shell is not None else None
            detail = (self._err.text().strip() if self._err else "")[-2000:]
            self._detach()
            raise SandboxError(f"the sandbox shell failed to start (exit status {code}): {detail}")
        self._ready = True

    # -- one command ----------------------------------------------------------------------------------------
    def _execute(self, line: str, timeout: float) -> ExecResult:
        started = time.monotonic()
        nonce = secrets.token_hex(16).encode()
        cap = self._sandbox.limits.max_output_bytes
        self._out, self._err = StreamCapture(cap, nonce), StreamCapture(cap, nonce)
        self._out.feed(self._carry_out)
        self._err.feed(self._carry_err)
        timed_out = False
        code = self._send(line, nonce, started + timeout)
        if code is None and self._box.shell is not None and self._alive():
            timed_out = True
            code = self._interrupt()
        if code is None:
            code = self._shell_ended()
        out, err = self._out, self._err
        self._carry_out, self._carry_err = bytes(out.after), bytes(err.after)
        stderr = err.text() + "".join(self._notes)
        self._notes.clear()
        return ExecResult(stdout=out.text(), stderr=stderr,
                          exit_code=TIMEOUT_EXIT_CODE if timed_out else code, timed_out=timed_out,
                          duration_s=time.monotonic() - started, truncated=out.truncated or err.truncated)

    def _send(self, line: str, nonce: bytes, deadline: float) -> int | None:
        """Send `line` followed by `__rl_done`, and wait for NONCE on stdout, stderr and the status channel:
        the command's status, or None (deadline passed or the shell died)."""
        shell = self._box.shell
        assert shell is not None and self._pump is not None
        host, inner = self._sandbox.put_io_file("nonce", nonce + b"\n")
        try:
            try:
                os.write(shell.stdin_fd, f"{line}; __rl_done $? {shlex.quote(inner)}\n".encode())
            except OSError:  # the shell is gone
                return None
            status: list[int] = []

            def finished() -> bool:
                assert self._out is not None and self._err is not None
                if not (self._out.found and self._err.found):
                    return False
                found = _take_status(self._status if shell.status_fd is not None else self._out.after, nonce)
                if found is not None:
                    status.append(found)
                return bool(status)

            return status[0] if self._pump.run(finished, deadline) else None
        finally:
            host.unlink(missing_ok=True)

    def _sync(self, deadline: float, fresh: bool = False) -> int | None:
        """Resynchronise on a new marker; `fresh` discards what came before (the shell's startup noise)."""
        nonce = secrets.token_hex(16).encode()
        if fresh or self._out is None or self._err is None:
            cap = self._sandbox.limits.max_output_bytes
            self._out, self._err = StreamCapture(cap, nonce), StreamCapture(cap, nonce)
        else:
            self._out.retarget(nonce)
            self._err.retarget(nonce)
        return self._send("\n(exit 0)", nonce, deadline)

    def _interrupt(self) -> int | None:
        """Stop the running command and resynchronise; None if the shell had to go."""
        shell = self._box.shell
        assert shell is not None
        shell.interrupt(hard=False)
        if self._sync(time.monotonic() + INTERRUPT_GRACE_S) is not None:
            return TIMEOUT_EXIT_CODE
        shell.interrupt(hard=True)
        if self._sync(time.monotonic() + KILL_GRACE_S) is not None:
            return TIMEOUT_EXIT_CODE
        self._notes.append(f"\n{NOTE}the command could not be interrupted, so the shell was restarted; "
                           "its working directory and variables were reset\n")
        self._detach()
        self.restarts += 1
        return TIMEOUT_EXIT_CODE

    def _alive(self) -> bool:
        shell = self._box.shell
        out, err = self._out, self._err
        return (shell is not None and shell.exit_code() is None and out is not None and err is not None
                and not out.eof and not err.eof)

    def _shell_ended(self) -> int:
        """The shell exited under the command (`exit`, killed): report its status; the next run restarts."""
        shell = self._box.shell
        if self._pump is not None:  # collect what it printed before dying
            self._pump.run(lambda: False, time.monotonic() + 0.2)
        code = shell.exit_code(2.0) if shell is not None else None
        self._notes.append(f"\n{NOTE}the shell exited (status {code}); the next command starts a fresh "
                           "shell\n")
        self._detach()
        self.restarts += 1
        return 0 if code is None else code


def _take_status(buffer: bytearray, nonce: bytes) -> int | None:
    """Find and consume the line `NONCE STATUS` in `buffer`; lines of other (earlier) commands are dropped."""
    at = buffer.find(nonce + b" ")
    if at < 0:
        return None
    end = buffer.find(b"\n", at)
    if end < 0:
        return None
    value = bytes(buffer[at + len(nonce) + 1:end])
    del buffer[:end + 1]
    try:
        return int(value)
    except ValueError:
        return None


def spawn_popen_shell(argv: list[str], *, env: dict[str, str], cwd: str | None, limits: SandboxLimits,
                      workdir: str, pipe_owner: int | None,
                      shell_class: type[PopenShell] = PopenShell) -> PopenShell:
    """Start `argv` (ending in DRIVER_ARGV) with a status pipe as an extra fd, and send the driver setup."""
    in_read, in_write = owned_pipe(pipe_owner)
    out_read, out_write = owned_pipe(pipe_owner)
    err_read, err_write = owned_pipe(pipe_owner)
    status_read, pipe_write = owned_pipe(pipe_owner)
    # The child inherits the write end under the same number and the setup moves it to fd 61; keep that number
    # clear of the fds the setup assigns (61-63), or `exec 61>&61 61>&-` would close it.
    status_write = fcntl.fcntl(pipe_write, fcntl.F_DUPFD_CLOEXEC, 64)
    os.close(pipe_write)
    try:
        proc = spawn_long_lived(argv, stdin=in_read, stdout=out_write, stderr=err_write, env=env, cwd=cwd,
                                pass_fds=(status_write,), start_new_session=True)
    except BaseException:
        close_fds(in_write, out_read, err_read, status_read)
        raise
    finally:
        close_fds(in_read, out_write, err_write, status_write)  # the child's ends
    return shell_class(proc, (in_write, out_read, err_read, status_read),
                       driver_setup(limits, workdir, status_write))
