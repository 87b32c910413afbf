"""The sandbox contract: limits, results, errors and the `Sandbox` base class every backend implements."""

from __future__ import annotations

import abc
import dataclasses
import math
import resource
import shlex
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rl_llm.checks import seconds
from rl_llm.errors import RLLMError

if TYPE_CHECKING:
    from rl_llm.sandboxes.quota import WorkspaceQuota
    from rl_llm.sandboxes.shell import ShellProcess, ShellSession
    from rl_llm.sandboxes.workspace import Workspace

Command = str | Sequence[str]
Stdin = str | bytes | None

# The layout inside a sandbox (bwrap and docker mount the workspace and the hand-in files at these paths).
INNER_WORKDIR = "/workspace"  # the agent's working directory
INNER_IO_DIR = "/run/rl-io"  # read-only files the host hands in
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def sandbox_env(home: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The whole environment commands start with: nothing leaks in from the host process."""
    env = {"PATH": SANDBOX_PATH, "HOME": home, "USER": "sandbox", "LOGNAME": "sandbox", "SHELL": "/bin/bash",
           "LANG": "C.UTF-8", "TERM": "dumb", "TMPDIR": "/tmp"}
    env.update(extra or {})
    return env


# Exit code reported when a command was killed at its wall-clock limit (GNU `timeout` uses it too).
TIMEOUT_EXIT_CODE = 124
# Exit code reported when a command was stopped for passing the workspace quota: 128 + SIGXFSZ, the signal of
# the per-file size limit, its nearest kin.
QUOTA_EXIT_CODE = 153
NOTE = "[rl-llm sandbox] "  # starts what the sandbox itself adds to a command's stderr
# Largest `python3 -c` argument; longer snippets go through a file (Linux caps one argv string at 128 KiB).
_MAX_ARGV_CODE = 100_000
_MAX_LIMIT = 2**40  # of any limit; in MB, 2**40 * 1024 KB is still within the kernel's 64-bit rlimits


class SandboxError(RLLMError, RuntimeError):
    """A sandbox could not do what was asked (it is closed, a shell failed to start, ...)."""


class SandboxUnavailable(SandboxError):
    """The requested backend cannot run on this machine; the message says why and what to install."""


class SandboxPathError(SandboxError, ValueError):
    """A workspace path is absolute, climbs out with `..`, or passes through a symlink."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits applied to everything run in a sandbox.

    wall_timeout: default seconds per command before it is killed (`run(timeout=...)` overrides it).
    cpu_time: CPU seconds per process (RLIMIT_CPU). memory_mb: address space per process (RLIMIT_AS).
    max_processes: processes and threads of the sandbox user (RLIMIT_NPROC, bound by giving every sandbox its
    own unprivileged uid). max_output_bytes: bytes kept per stream per command; the rest is drained, counted
    and dropped.
    max_file_size_mb: largest file a process may write (RLIMIT_FSIZE). max_open_files: RLIMIT_NOFILE.
    network: False gives an empty network namespace (loopback only). tmp_size_mb: size of the private /tmp.
    workspace_size_mb: total disk space of the workspace, whose files outlive the command that wrote them. The
    workspace is a folder on the host's disk, shared with every other sandbox and the training run there, and
    the per-file limit alone lets a command (or a background job) write file after file until that disk is
    full. The host measures it after every command and while processes of the sandbox may be writing (at most
    `quota.MAX_ENTRIES` entries, `quota.MAX_DEPTH` levels deep); past it, every process of the sandbox is
    killed and the command fails with exit code 153 (`QUOTA_EXIT_CODE`, `ExecResult.over_quota`) and a note.
    The files stay, so the agent can delete some and go on; until it is back under, it may not grow.
    """

    wall_timeout: float = 30.0
    cpu_time: int = 60
    memory_mb: int = 1024
    max_processes: int = 64
    max_output_bytes: int = 1_000_000
    max_file_size_mb: int = 64
    max_open_files: int = 256
    network: bool = False
    tmp_size_mb: int = 64
    workspace_size_mb: int = 512

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "network":
                if not isinstance(value, bool):
                    raise TypeError(f"SandboxLimits.network must be a bool, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= _MAX_LIMIT:
                # The bound: bash's ulimit takes kilobytes and refused 1e15 MB ("limit out of range"), which
                # failed every command of the sandbox with exit code 125 instead of refusing the limit.
                raise ValueError(f"SandboxLimits.{field.name} must be a positive number up to 2**40, got {value!r}")
        seconds("SandboxLimits.wall_timeout", self.wall_timeout)  # the words and bound of run(timeout=...)
        if self.max_processes < 8:
            raise ValueError("SandboxLimits.max_processes must be at least 8 (the shell itself needs a few)")
        if self.max_open_files < 16:
            raise ValueError("SandboxLimits.max_open_files must be at least 16")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(field.name for field in dataclasses.fields(cls))

    @classmethod
    def from_kwargs(cls, base: SandboxLimits | None = None, **overrides: object) -> SandboxLimits:
        unknown = sorted(set(overrides) - set(cls.names()))
        if unknown:
            raise TypeError(f"unknown sandbox limit(s) {unknown}; valid limits are {list(cls.names())}")
        return dataclasses.replace(base or cls(), **overrides)  # type: ignore[arg-type]

    def ulimit_command(self) -> str:
        """A bash `ulimit` line setting soft and hard limits (so the sandbox cannot raise them again)."""
        def whole(value: float, rlimit: int | None = None) -> int:
            value = math.ceil(value)  # a fractional limit rounds up, never down to 0 (= no time at all)
            hard = resource.getrlimit(rlimit)[1] if rlimit is not None else resource.RLIM_INFINITY
            return value if hard == resource.RLIM_INFINITY else min(value, hard)  # cannot raise a hard limit

        return (f"ulimit -HS -t {whole(self.cpu_time)} -v {whole(self.memory_mb * 1024)}"
                f" -u {whole(self.max_processes, resource.RLIMIT_NPROC)}"
                f" -f {whole(self.max_file_size_mb * 1024)}"
                f" -n {whole(self.max_open_files, resource.RLIMIT_NOFILE)} -c 0")


@dataclass(frozen=True)
class ExecResult:
    """What one command did. `exit_code` is 124 when `timed_out`; `truncated` when a stream passed the cap;
    `over_quota` when the workspace passed its size quota while it ran, so every process of the sandbox was
    killed (`exit_code` 153 unless it also timed out; stderr ends with a note saying so)."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    duration_s: float
    truncated: bool = False
    over_quota: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def output(self) -> str:
        """stdout followed by stderr, for observations that show both."""
        if self.stdout and self.stderr and not self.stdout.endswith("\n"):
            return f"{self.stdout}\n{self.stderr}"
        return self.stdout + self.stderr


def as_bytes(data: str | bytes, what: str) -> bytes:
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"{what} must be str or bytes, got {type(data).__name__}")


def command_text(cmd: Command) -> str:
    """A shell command line from a string, or from an argv list (each word quoted, nothing expanded)."""
    if isinstance(cmd, str):
        text = cmd
    elif isinstance(cmd, Sequence) and cmd and all(isinstance(word, str) for word in cmd):
        text = shlex.join(cmd)
    else:
        raise TypeError(f"command must be a str or a non-empty list of str, got {cmd!r}")
    if "\0" in text:
        raise ValueError("command contains a NUL byte, which no shell can pass on")
    return text


def checked_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """Extra environment variables for one command, checked here: the kernel and `os` would refuse them later
    with a bare TypeError, "embedded null byte" or "Argument list too long"."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be a mapping of str to str, got {type(env).__name__}")
    for name, value in env.items():
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise ValueError(f"env: {name!r} is not a variable name (a non-empty str without '=' or NUL)")
        if not isinstance(value, str) or "\0" in value:
            raise ValueError(f"env[{name!r}] must be a str without NUL bytes, got {value!r}"[:200])
        if len(name.encode()) + len(value.encode()) > _MAX_ARGV_CODE:
            raise ValueError(f"env[{name!r}] is too long (over {_MAX_ARGV_CODE:,} bytes): hand big data in "
                             "as stdin or a file")
    return dict(env)


def python_argv(script: str) -> list[str]:
    """`python3 -c` running the file `script` as if its text were given with -c (cwd first on sys.path)."""
    loader = "import sys; p = sys.argv.pop(); exec(compile(open(p).read(), '<string>', 'exec'))"
    return ["python3", "-c", loader, script]


class Sandbox(abc.ABC):
    """An isolated place to run model-written commands, with a private writable workspace.

    `run()` executes one command and returns an `ExecResult`; nothing it starts outlives it (bwrap; with
    docker and local, a process that leaves the command's process group lives until `kill_processes()`).
    `session()` opens a persistent shell whose cwd and variables carry over between commands.
    `kill_processes()` ends the sessions and kills every process, keeping the workspace; `reset()` also
    wipes the workspace; `close()` also frees the workspace and the uid.
    Paths given to `write_file`/`read_file` are relative to the workspace; leaving it is refused.
    The workspace's total size is held to `limits.workspace_size_mb` (see `quota.py`).
    """

    backend: ClassVar[str]
    inner_workdir: str  # where the workspace appears to commands (also their cwd and $HOME)

    def __init__(self, limits: SandboxLimits, workspace: Workspace, keep_warm: bool = False) -> None:
        self.limits = limits
        self._workspace = workspace
        self.keep_warm = keep_warm
        self._closed = False
        from rl_llm.sandboxes.quota import WorkspaceQuota

        self._quota = WorkspaceQuota(workspace.path, limits.workspace_size_mb,
                                     weakref.WeakMethod(self._stop_writers),
                                     weakref.WeakMethod(self._may_have_processes))
        # Everything cleanup needs lives here, not on self, so the finalizer does not keep the sandbox alive.
        self._res = _Resources(workspace, self._quota)
        self._finalizer = weakref.finalize(self, self._res.cleanup)

    # -- the surface every environment uses ---------------------------------------------------------------
    @property
    def workdir(self) -> Path:
        """Host path of the writable workspace."""
        return self._workspace.path

    @property
    def closed(self) -> bool:
        return self._closed

    def run(self, cmd: Command, timeout: float | None = None, stdin: Stdin = None,
            env: Mapping[str, str] | None = None) -> ExecResult:
        """Run `cmd` (a bash command line, or an argv list run without a shell) in a fresh process tree."""
        self._check_open()
        text = command_text(cmd)  # validates the type and refuses NUL bytes
        limit, data = self._timeout(timeout), None if stdin is None else as_bytes(stdin, "stdin")
        variables = checked_env(env)
        if len(text.encode()) <= _MAX_ARGV_CODE:
            return self._quota.guard(lambda: self._run(cmd, limit, data, variables))
        # Past the kernel's cap on one argv string, bash reads the command from a file (as sessions always do);
        # an argv list goes as its quoted words, which bash splits back into the same words.
        host, inner = self.put_io_file("cmd", text.encode())
        try:
            return self._quota.guard(lambda: self._run(f". {shlex.quote(inner)}", limit, data, variables))
        finally:
            host.unlink(missing_ok=True)

    def run_python(self, code: str, timeout: float | None = None, stdin: Stdin = None) -> ExecResult:
        """Run a Python snippet with the sandbox's `python3` in the workspace; big snippets go via a file."""
        if not isinstance(code, str):
            raise TypeError(f"code must be str, got {type(code).__name__}")
        if len(code.encode()) <= _MAX_ARGV_CODE:
            return self.run(["python3", "-c", code], timeout=timeout, stdin=stdin)
        host, inner = self.put_io_file("snippet", code.encode())
        try:
            return self.run(python_argv(inner), timeout=timeout, stdin=stdin)
        finally:
            host.unlink(missing_ok=True)

    def session(self) -> ShellSession:
        """A persistent bash in this sandbox (see `ShellSession`). Sessions end at `reset()` and `close()`."""
        from rl_llm.sandboxes.shell import ShellSession

        self._check_open()
        session = ShellSession(self, self._res.take_spare())
        self._res.sessions.add(session)
        return session

    def write_file(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        self._check_open()
        self._workspace.write_file(path, as_bytes(data, "data"), mode)

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        self._check_open()
        return self._workspace.read_file(path, max_bytes)

    def kill_processes(self) -> None:
        """End every session and kill every process of this sandbox, leaving the workspace as it is.

        Afterwards nothing the sandbox ran can still change the workspace: not even processes a command or a
        session detached from itself (`setsid`, `nohup`, double forks), so a check run next sees a settled
        state. (The unsafe `local` backend, when not running as root, finds detached processes by the
        environment they inherited, so one that replaced its whole environment escapes it.)"""
        self._check_open()
        with self._quota.hold(wiped=False):
            self._end_processes("the sandbox's processes were killed")
        self._warm_up()

    def reset(self) -> None:
        """Kill every process of this sandbox, end its sessions and wipe the workspace."""
        self._check_open()
        with self._quota.hold(wiped=True):  # a quota stop of the old episode cannot reach the new one
            self._end_processes("the sandbox was reset")
            self._workspace.wipe()
            self._wipe_private_dirs()
        self._warm_up()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._finalizer()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"workdir={str(self.workdir)!r}"
        return f"<{type(self).__name__} {state}>"

    # -- what a backend provides --------------------------------------------------------------------------
    @abc.abstractmethod
    def _run(self, cmd: Command, timeout: float, stdin: bytes | None, env: dict[str, str]) -> ExecResult: ...

    @abc.abstractmethod
    def spawn_shell(self) -> ShellProcess:
        """Start a driver shell (`shell.DRIVER_ARGV`) in the sandbox, with its setup already sent."""

    def _kill_all(self) -> bool:
        """Kill every process of this sandbox (its sessions are ended next); True if that included the spare
        shell. (bwrap overrides this: ending the sessions kills their PID namespaces, and with them all.)"""
        self._workspace.kill_processes()
        return True

    def _wipe_private_dirs(self) -> None:
        """Empty the sandbox's own temporary directories at reset where they outlive its processes (docker's
        container /tmp, local's TMPDIR). bwrap needs nothing: each command and session has a fresh /tmp."""
        return None

    def _inner_io_dir(self) -> str:
        """Where the private io directory (stdin and snippet files) appears to commands."""
        return "/run/rl-io"

    def _kill_commands(self) -> None:
        """Kill the one-off commands in flight where `_kill_all` does not reach them (bwrap: each runs in a
        PID namespace of its own)."""
        return None

    def _may_have_processes(self) -> bool:
        """Whether, with no command running, a process of this sandbox may still write to the workspace (the
        quota watcher measures while it may). Docker and local cannot tell detached processes from none; bwrap
        answers from its sessions' process trees."""
        return True

    def _stop_writers(self) -> None:
        """What passing the workspace quota does: kill every process that could write to the workspace (the
        commands in flight, the sessions' shells and all they started), keeping the files and the sessions,
        each of which starts a fresh shell for its next command."""
        if self._closed:
            return
        if self._kill_all():
            self._res.drop_spare()  # it was killed too
        self._kill_commands()
        for session in list(self._res.sessions):
            session._restart("the workspace passed its size quota")

    # -- shared plumbing ----------------------------------------------------------------------------------
    def _end_processes(self, reason: str) -> None:
        # Killing comes first: a process detached from a session may hold the session's output open, and
        # docker keeps ending the session waiting for that (while the process goes on running).
        killed_spare = self._kill_all()
        self._res.end_sessions(reason, keep_spare=not killed_spare)  # an unused spare is still pristine

    def _warm_up(self) -> None:
        if self.keep_warm and self._res.spare is None:
            self._start_warm()

    def _start_warm(self) -> None:
        """Start a spare shell in the background so the next `session()` finds it (at creation and reset)."""
        self._res.set_spare(_WARMER.submit(self.spawn_shell))

    def put_io_file(self, prefix: str, data: bytes) -> tuple[Path, str]:
        """Hand data (stdin, a script) to commands via the read-only io directory: (host path, inner path)."""
        host = self._workspace.put_io(prefix, data)
        return host, f"{self._inner_io_dir()}/{host.name}"

    def _timeout(self, timeout: float | None) -> float:
        value = self.limits.wall_timeout if timeout is None else timeout
        # At most MAX_SECONDS: infinity or 1e30 passed "> 0" and overflowed the clock deep inside the wait.
        return seconds("timeout", value)

    def _shell_argv(self, cmd: Command) -> list[str]:
        """bash applying the limits, then running `cmd` (a command line, or an argv list without a shell).
        The EXIT trap stops bash from exec'ing the last command, so bash stays the top process (PID 1 in a
        bwrap namespace, reaping orphans) and the command keeps normal signal handling."""
        prefix = f"trap : EXIT; {self.limits.ulimit_command()} || exit 125"
        if isinstance(cmd, str):
            return ["/bin/bash", "-c", f"{prefix}; {cmd}"]
        return ["/bin/bash", "-c", f'{prefix}; "$@"', "rl-sandbox", *cmd]

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"{type(self).__name__} is closed")


class _Resources:
    """What a sandbox must give back: sessions, a spare shell, backend extras (containers), the workspace."""

    def __init__(self, workspace: Workspace, quota: WorkspaceQuota) -> None:
        self.workspace = workspace
        self.quota = quota
        self.sessions: weakref.WeakSet[ShellSession] = weakref.WeakSet()
        self.spare: Future[ShellProcess] | None = None
        self.extra_cleanup: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def set_spare(self, spare: Future[ShellProcess]) -> None:
        with self._lock:
            old, self.spare = self.spare, spare
        _kill_spare(old)

    def take_spare(self) -> ShellProcess | None:
        with self._lock:
            spare, self.spare = self.spare, None
        if spare is None or spare.exception() is not None:
            return None  # a failed warm-up: the session starts its own shell and reports the error
        return spare.result()

    def drop_spare(self) -> None:
        with self._lock:
            spare, self.spare = self.spare, None
        _kill_spare(spare)

    def end_sessions(self, reason: str, keep_spare: bool = False) -> None:
        for session in list(self.sessions):
            session._end(reason)
        if not keep_spare:
            self.drop_spare()

    def cleanup(self) -> None:
        """Runs once, from close(), garbage collection or interpreter exit: nothing survives it."""
        try:
            self.quota.close()  # first: no quota stop may run while the sandbox is torn down
            self.end_sessions("the sandbox was closed")
            for step in self.extra_cleanup:
                step()
        finally:
            self.workspace.release()


def _kill_spare(spare: Future[ShellProcess] | None) -> None:
    if spare is not None and spare.exception() is None:  # waits for a warm-up still in flight
        spare.result().kill()


# Spare shells start off the caller's thread, so a pool's release does not wait for bwrap to come up.
_WARMER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="rl-llm-sandbox-warmer")
