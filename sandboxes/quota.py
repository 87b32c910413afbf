"""The workspace quota: a cap on the total disk space of a sandbox's writable workspace.

Why the host measures instead of a file system limit. The other limits are the kernel's (rlimits, a sized
tmpfs for /tmp), but the workspace is a host directory that every command and session of the sandbox shares
and the host reads, and no kernel limit fits it portably: a sized tmpfs or a loop-mounted image needs root
with CAP_SYS_ADMIN in the host's mount namespace (bwrap can mount a tmpfs only inside one command's
namespace, which dies with it), a tmpfs spends RAM, and project quotas depend on the file system and its
mount options; docker's `--storage-opt size=` bounds only the container's own layer, on some storage drivers,
and the workspace is a bind mount outside it. So the host walks the workspace itself, the same way on every
backend: after every command, and every POLL_S seconds (more rarely for a workspace that takes long to walk)
while a command runs or, between commands, while a process it started may still be writing (bwrap tells from
its sessions' process trees; docker and local cannot, so until the next kill or reset). Past the quota, every
process of the sandbox is killed and the command's result says so. The files stay, so the agent can delete
some and go on; while the workspace is over the quota it may not grow, and a command that does not make it
grow is not stopped (a slow `rm` must finish). Disk use thus stays within the quota plus, for each command
that writes past it, what the sandbox's processes write in one poll interval (each file is also capped by
RLIMIT_FSIZE); a reset wipes it all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from rl_llm.sandboxes.base import NOTE, QUOTA_EXIT_CODE, ExecResult

log = logging.getLogger("rl_llm.sandboxes")

MIB = 1024 * 1024
# A walk stops here and the workspace counts as over the quota: this bounds the walk's time (2-3 us an
# entry, a stat each) and the inodes a sandbox can take, and a walk holds one descriptor per level it is down.
# Past either, the walk cannot tell growth from none, so until they are removed every command is stopped at
# the next measurement (a reset clears it).
MAX_ENTRIES = 100_000
MAX_DEPTH = 128
POLL_S = 0.2  # between measurements while something may be writing
DUTY = 20  # ... and at least this many times as long as the last walk took: a walk costs at most 5% of a core
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OWNER_RX = stat.S_IRUSR | stat.S_IXUSR


@dataclass(frozen=True)
class Usage:
    """What a walk found: bytes on disk, entries, and `problem` when it stopped early (too many entries, too
    deep), which counts as over the quota."""

    bytes: int
    entries: int
    problem: str | None = None


def measure(path: Path) -> Usage:
    """The disk space of everything below `path`: regular files at the larger of their size and allocation
    (neither sparse nor compressed files count low), hard links once, directories and symlinks at their
    allocation. Symlinks are never followed, not even one swapped in during the walk."""
    top = _open_dir(str(path), None)
    if top is None:  # gone: the sandbox is being closed
        return Usage(0, 0)
    walk = _Walk()
    walk.run(top)
    return Usage(walk.bytes, walk.entries, walk.problem)


class _Dir:
    """An open directory of the walk: its subdirectories still to visit, and the mode to put back if the walk
    had to make it readable."""

    __slots__ = ("fd", "mode", "todo")

    def __init__(self, fd: int, mode: int | None) -> None:
        self.fd, self.mode = fd, mode
        self.todo: list[str] = []

    def close(self) -> None:
        if self.mode is not None:
            with contextlib.suppress(OSError):
                os.fchmod(self.fd, self.mode)
        os.close(self.fd)


class _Walk:
    """Depth first, iteratively, one descriptor per level (never a path, which a symlink could redirect)."""

    def __init__(self) -> None:
        self.bytes = self.entries = 0
        self.problem: str | None = None
        self._linked: set[tuple[int, int]] = set()

    def run(self, top: _Dir) -> None:
        stack = [top]
        try:
            self._scan(top)
            while stack and self.problem is None:
                current = stack[-1]
                if not current.todo:
                    stack.pop().close()
                elif len(stack) > MAX_DEPTH:
                    self.problem = f"nests directories more than {MAX_DEPTH} levels deep"
                elif (child := _open_dir(current.todo.pop(), current.fd)) is not None:
                    stack.append(child)
                    self._scan(child)
        finally:
            for level in reversed(stack):
                level.close()

    def _scan(self, directory: _Dir) -> None:
        try:
            with os.scandir(directory.fd) as entries:
                for entry in entries:
                    self.entries += 1
                    if self.entries > MAX_ENTRIES:
                        self.problem = f"holds more than {MAX_ENTRIES:,} files and directories"
                        return
                    self._count(entry, directory)
        except OSError:  # removed meanwhile: the next walk counts what is there then
            return

    def _count(self, entry: os.DirEntry[str], directory: _Dir) -> None:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:  # deleted since it was listed
            return
        if stat.S_ISDIR(info.st_mode):
            directory.todo.append(entry.name)
        elif stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
            if (info.st_dev, info.st_ino) in self._linked:
                return
            self._linked.add((info.st_dev, info.st_ino))
        allocated = info.st_blocks * 512
        self.bytes += max(info.st_size, allocated) if stat.S_ISREG(info.st_mode) else allocated


def _open_dir(name: str, parent: int | None) -> _Dir | None:
    """Directory `name` of `parent` opened without following a symlink, or None if it is gone or no longer a
    directory. A directory its owner locked (``chmod 000``, or no search bit) would hide its files from a host
    that is not root (root reads anything), so the walk lets the owner read and search it while it is inside
    and puts the mode back after (the sandbox's files are the host user's own there)."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except PermissionError:
        return _open_locked(name, parent)
    except OSError:
        return None
    if os.geteuid() == 0:
        return _Dir(fd, None)
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    if mode & _OWNER_RX == _OWNER_RX:
        return _Dir(fd, None)
    with contextlib.suppress(OSError):
        os.fchmod(fd, mode | _OWNER_RX)
    return _Dir(fd, mode)


def _open_locked(name: str, parent: int | None) -> _Dir | None:
    """Open a directory without read permission: through an O_PATH descriptor (no symlink can be swapped in
    between), grant the owner read and search, then open it for real."""
    o_path = getattr(os, "O_PATH", 0)
    if not o_path:
        return None
    try:
        handle = os.open(name, o_path | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return None
    try:
        mode = stat.S_IMODE(os.fstat(handle).st_mode)
        os.chmod(f"/proc/self/fd/{handle}", mode | _OWNER_RX)  # chmod of an O_PATH descriptor goes via /proc
        try:
            return _Dir(os.open(".", _DIR_FLAGS, dir_fd=handle), mode)
        except OSError:
            os.chmod(f"/proc/self/fd/{handle}", mode)
            return None
    except OSError:  # not the host user's (then root would not have needed this)
        return None
    finally:
        os.close(handle)


class WorkspaceQuota:
    """Enforces `SandboxLimits.workspace_size_mb` for one sandbox (see the module docstring).

    `guard(command)` runs a command (a callable returning its ExecResult) and measures the workspace after it;
    a watcher thread, started with the first command, measures while commands run and while processes may
    linger. `stop_writers` kills every process of the sandbox, keeping the files; `may_have_processes` says
    whether, with no command running, one may still be writing. Both are weak, so the watcher does not keep
    the sandbox alive.
    """

    def __init__(self, path: Path, quota_mb: float, stop_writers: weakref.WeakMethod[Callable[[], None]],
                 may_have_processes: weakref.WeakMethod[Callable[[], bool]]) -> None:
        self.path = path
        self.quota_mb = quota_mb
        self.quota = int(quota_mb * MIB)
        self._stop_writers = stop_writers
        self._may_have_processes = may_have_processes
        self._lock = threading.Lock()  # the state below
        self._check_lock = threading.Lock()  # one measure-and-stop at a time; reset and close wait for it
        self._ceiling = self.quota  # above the quota: what was left at the last stop, less what went since
        self._busy = 0  # commands in flight
        self._settled = True  # nothing ran since the last kill or reset, so no process can be writing
        self._stops = 0
        self._message = ""  # why the writers were stopped, the last time
        self._unreported: str | None = None  # a stop while no command ran, for the next result to tell
        self._walk_s = 0.0
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def guard(self, command: Callable[[], ExecResult]) -> ExecResult:
        """Run `command`; its result tells of a stop during it (exit code QUOTA_EXIT_CODE, `over_quota`), of
        one since the last result, or that the workspace is still over the quota."""
        stops = self._begin()
        try:
            return self._report(command(), stops)
        finally:
            with self._lock:
                self._busy -= 1

    def check(self) -> Usage:
        """Measure the workspace and, if it passed the quota (or grew while over it), stop every writer.
        Returns the usage left."""
        with self._check_lock:
            if self._closed.is_set():
                return Usage(0, 0)
            usage = self._measure()
            if not self._over(usage):
                return usage
            _call_weak(self._stop_writers, None)
            left = self._measure()
            with self._lock:
                self._stops += 1
                self._ceiling = self.quota if left.problem else max(self.quota, left.bytes)
                self._message = self._stopped(usage)
                if not self._busy:
                    self._unreported = ("while no command was running (a background job kept writing), "
                                        f"{self._message}")
            return left

    @contextlib.contextmanager
    def hold(self, wiped: bool) -> Iterator[None]:
        """No measuring while the sandbox kills its processes (and wipes the workspace); afterwards nothing of
        it runs, and a wiped workspace starts afresh (no ceiling, no stop left to report)."""
        with self._check_lock:
            yield
            with self._lock:
                self._settled = not self._busy
                if wiped:
                    self._ceiling, self._unreported = self.quota, None

    def close(self) -> None:
        """Stop the watcher; returns once no measurement or stop is under way (unless it runs on the watcher
        itself: a sandbox dropped by everyone else is finalized wherever its last reference goes, which may be
        the watcher's own call of `stop_writers`, and that thread holds the lock)."""
        self._closed.set()
        self._wake.set()
        if threading.current_thread() is not self._thread:
            with self._check_lock:
                pass

    # -- helpers ------------------------------------------------------------------------------------------
    def _begin(self) -> int:
        with self._lock:
            self._busy += 1
            self._settled = False
            if self._thread is None and not self._closed.is_set():
                self._thread = threading.Thread(target=self._watch, name="rl-llm-sandbox-quota", daemon=True)
                self._thread.start()
            stops = self._stops
        self._wake.set()
        return stops

    def _report(self, result: ExecResult, stops: int) -> ExecResult:
        stopped, notes = self._notes(self.check(), stops)
        if not notes:
            return result
        stderr = result.stderr + "".join(f"\n{NOTE}{note}\n" for note in notes)
        if not stopped:
            return replace(result, stderr=stderr)
        code = result.exit_code if result.timed_out else QUOTA_EXIT_CODE  # a timeout keeps its 124
        return replace(result, stderr=stderr, exit_code=code, over_quota=True)

    def _notes(self, usage: Usage, stops: int) -> tuple[bool, list[str]]:
        """(whether the writers were stopped since `stops` was read, what to tell the agent)."""
        with self._lock:
            stopped = self._stops != stops
            notes = [self._unreported] if self._unreported else []
            self._unreported = None
            if stopped:
                notes.append(self._message)
        if not notes and usage.bytes > self.quota:
            notes.append(f"the workspace is still over its size quota: it takes {_mb(usage.bytes)} of "
                         f"{self.quota_mb:g} MB; delete files to get below it (a command that makes it grow "
                         "is stopped)")
        return stopped, notes

    def _over(self, usage: Usage) -> bool:
        """Past the quota, or grown above the ceiling while over it; otherwise a lower usage lowers the
        ceiling (what the agent deleted may not be written again)."""
        if usage.problem is not None:
            return True
        with self._lock:
            if usage.bytes > self._ceiling:
                return True
            self._ceiling = max(self.quota, min(self._ceiling, usage.bytes))
            return False

    def _stopped(self, usage: Usage) -> str:
        what = (f"the workspace {usage.problem}" if usage.problem else
                f"the workspace passed its size quota: it takes {_mb(usage.bytes)} of {self.quota_mb:g} MB")
        return (f"{what}, so every process of the sandbox was stopped. Delete files to get below the quota; "
                "while the workspace is over it, a command that makes it grow is stopped again")

    def _measure(self) -> Usage:
        started = time.monotonic()
        usage = measure(self.path)
        self._walk_s = time.monotonic() - started
        return usage

    def _watch(self) -> None:
        while not self._closed.is_set():
            if not self._needed():
                self._wake.clear()
                if not self._needed():  # a command that began after the clear has set it again
                    self._wake.wait()
                continue
            if self._closed.wait(max(POLL_S, DUTY * self._walk_s)):
                return
            try:
                if self._needed():
                    self.check()
            except Exception:  # e.g. docker could not kill; the next poll or command tries again
                log.exception("the workspace quota check of %s failed", self.path)

    def _needed(self) -> bool:
        with self._lock:
            if self._busy:
                return True
            if self._settled:
                return False
        try:
            return bool(_call_weak(self._may_have_processes, False))
        except Exception:  # e.g. a session opened while the list of them was taken: measure, to be safe
            log.debug("could not tell whether %s has processes", self.path, exc_info=True)
            return True


def _call_weak(method: weakref.WeakMethod[Callable[[], object]], default: object) -> object:
    """Call a weakly held bound method; `default` once its object is gone."""
    bound = method()
    return default if bound is None else bound()


def _mb(size: int) -> str:
    return f"{size / MIB:.1f} MB"
