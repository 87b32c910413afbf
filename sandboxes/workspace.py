"""The host side of a sandbox: a claimed slot (its own uid and directory), safe file access, and cleanup.

Every sandbox claims a numbered slot under one base directory by taking an exclusive `flock` on the slot's
directory. The lock dies with the process, so a slot whose lock can be taken but whose directory is not empty
was left by a crashed owner: its processes are killed and its files removed before anyone reuses it.

When running as root, slot N runs its commands as uid `UID_BASE + N` (no passwd entry needed). Root is exempt
from RLIMIT_NPROC, and all sandboxes sharing one uid would share one process count, so a private unprivileged
uid is what makes the process limit real. It also lets `kill_uid` end every process of a sandbox at once.
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import logging
import os
import secrets
import stat
import subprocess
import tempfile
import time
from pathlib import Path, PurePosixPath

from rl_llm.sandboxes.base import SandboxError, SandboxPathError

log = logging.getLogger("rl_llm.sandboxes")

UID_BASE = 0x60000000  # far above real users, systemd dynamic users and the usual subuid ranges
MAX_SLOTS = 4096
INNER_UID = 1000  # the uid commands see inside bwrap and docker sandboxes
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_swept = False


def running_as_root() -> bool:
    return os.geteuid() == 0


def as_user(uid: int) -> list[str]:
    """argv prefix that runs a program as `uid` (via `setpriv`, so Python can still spawn with vfork)."""
    if not running_as_root() or uid == os.geteuid():
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


def kill_uid(uid: int, wait: float = 2.0) -> None:
    """SIGKILL every process owned by `uid` (kill(-1) as that uid; one pass suffices, see kill(2)), then wait
    until they have died, so the slot's next sandbox does not start with its process limit partly used."""
    if not running_as_root() or uid < UID_BASE or not _uid_has_processes(uid):
        return
    subprocess.run([*as_user(uid), "kill", "-KILL", "-1"], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
    deadline = time.monotonic() + wait
    while _uid_has_processes(uid) and time.monotonic() < deadline:
        time.sleep(0.01)


def _uid_has_processes(uid: int) -> bool:
    """Whether a live process (not a zombie waiting for the host's init) has real uid `uid`. Read from
    /proc/PID/status: the owner of /proc/PID shows root for processes that are not dumpable."""
    needle = f"\nUid:\t{uid}\t".encode()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/status", "rb") as handle:
                    status = handle.read()
            except OSError:
                continue
            if needle in status and b"\nState:\tZ" not in status:
                return True
    return False


def base_dir() -> Path:
    name = "rl-llm-sandboxes" if running_as_root() else f"rl-llm-sandboxes-{os.geteuid()}"
    base = Path(tempfile.gettempdir()) / name
    with contextlib.suppress(FileExistsError):
        os.mkdir(base, 0o711)
    info = os.lstat(base)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise SandboxError(f"{base} is not a private directory of this user; remove it and try again")
    return base


def cleanup_stale() -> int:
    """Remove the slots of sandboxes whose process died without closing them; returns how many."""
    base = base_dir()
    removed = 0
    for entry in os.scandir(base):
        if entry.name.isdigit() and int(entry.name) < MAX_SLOTS:
            claimed = _claim(base, int(entry.name))
            if claimed is not None:
                _release_slot(base / entry.name, claimed, int(entry.name))
                removed += 1
    return removed


def _slot_uid(slot: int) -> int:
    return UID_BASE + slot if running_as_root() else os.geteuid()


def _claim(base: Path, slot: int) -> int | None:
    """Lock slot `slot`, clearing what a dead owner left: the lock fd, or None if a live process holds it."""
    path = base / str(slot)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o711)
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:  # removed by its releasing owner between mkdir and open
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(path, follow_symlinks=False).st_ino != os.fstat(fd).st_ino:
            raise BlockingIOError  # the directory was released and recreated under us
    except (BlockingIOError, FileNotFoundError):
        os.close(fd)
        return None
    if os.listdir(path):
        log.info("sandbox slot %s was left by a dead process; cleaning it", path)
        kill_uid(_slot_uid(slot))
        clear_directory(path)
    return fd


def _release_slot(path: Path, lock_fd: int, slot: int) -> None:
    try:
        kill_uid(_slot_uid(slot))
        clear_directory(path)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(path)
    finally:
        os.close(lock_fd)


def clear_directory(path: Path) -> None:
    """Delete everything below `path` without following symlinks, whatever the sandbox did to it: any modes
    (``chmod -R 000``), immutable or append-only flags, fifos, sockets and devices (unlinked, never opened
    for reading), and nesting of any depth (the walk holds one directory fd at a time and no recursion, so
    10,000 nested directories are not a RecursionError or an fd exhaustion)."""
    with contextlib.suppress(OSError):
        os.chmod(path, 0o711)
    _clear_flags(str(path), None)
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return
    _empty_tree(fd)


def _empty_tree(fd: int) -> None:
    """Remove everything below the directory open at `fd` (closed on return), depth first, iteratively."""
    names: list[str] = []  # the path from the top to the directory open at fd
    try:
        while True:
            child = _unlink_files_find_dir(fd)
            if child is not None:
                with contextlib.suppress(OSError):  # a directory made unreadable (matters when not root)
                    os.chmod(child, 0o700, dir_fd=fd)
                _clear_flags(child, fd)
                try:
                    child_fd = os.open(child, _DIR_FLAGS, dir_fd=fd)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                os.close(fd)
                fd = child_fd
                names.append(child)
                continue
            if not names:
                return
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(names.pop(), dir_fd=fd)
    finally:
        os.close(fd)


def _unlink_files_find_dir(fd: int) -> str | None:
    """Unlink every non-directory in the directory open at `fd`; return one subdirectory's name, if any."""
    with os.scandir(fd) as entries:
        listed = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
    found = None
    for name, is_dir in listed:
        if is_dir:
            found = found or name
            continue
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        except PermissionError:  # immutable or append-only: clear the flags, then unlink
            _clear_flags(name, fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)
    return found


# ioctl numbers of <linux/fs.h> (64-bit) and the flags that stop even root from deleting a file.
_FS_IOC_GETFLAGS, _FS_IOC_SETFLAGS = 0x80086601, 0x40086602
_FS_UNDELETABLE = 0x10 | 0x20  # FS_IMMUTABLE_FL | FS_APPEND_FL


def _clear_flags(name: str, dir_fd: int | None) -> None:
    """Clear the immutable and append-only flags of a file or directory (root only; best effort)."""
    if not running_as_root():
        return
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:  # a symlink, a socket, or a file system without flags
        return
    try:
        flags = array.array("i", [0])
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, flags, True)
        if flags[0] & _FS_UNDELETABLE:
            flags[0] &= ~_FS_UNDELETABLE
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, flags, True)
    except OSError:
        pass
    finally:
        os.close(fd)


def _relative_parts(path: str) -> tuple[str, ...]:
    if not isinstance(path, str):
        raise TypeError(f"path must be str, got {type(path).__name__}")
    pure = PurePosixPath(path)
    if not path or "\0" in path or pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise SandboxPathError(f"{path!r} is not a relative path inside the workspace")
    parts = tuple(part for part in pure.parts if part != ".")
    if not parts:
        raise SandboxPathError(f"{path!r} names the workspace itself, not a file in it")
    return parts


class Workspace:
    """A claimed slot: `path` (the writable workspace) and `io_dir` (inputs the sandbox may only read)."""

    def __init__(self) -> None:
        global _swept
        base = base_dir()
        if not _swept:
            _swept = True
            cleanup_stale()
        for slot in range(MAX_SLOTS):
            lock_fd = _claim(base, slot)
            if lock_fd is not None:
                break
        else:
            raise SandboxError(f"all {MAX_SLOTS} sandbox slots under {base} are in use")
        self.slot = slot
        self.root = base / str(slot)
        self._lock_fd: int | None = lock_fd
        self.uid = self.gid = _slot_uid(slot)
        self.path = self.root / "workspace"
        self.io_dir = self.root / "io"
        for directory in (self.path, self.io_dir):
            directory.mkdir(mode=0o755)
        self._own(self.path)
        os.chmod(self.path, 0o700)

    # -- file access from the host ------------------------------------------------------------------------
    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        parts = _relative_parts(path)
        dir_fd = self._open_dir(parts[:-1], path, create=True)
        tmp = f".rl-tmp-{secrets.token_hex(6)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                         dir_fd=dir_fd)
            try:
                with os.fdopen(fd, "wb", closefd=False) as handle:
                    handle.write(data)
                os.fchmod(fd, mode)
                if running_as_root():
                    os.fchown(fd, self.uid, self.gid)
            finally:
                os.close(fd)
            # rename replaces a symlink or hard link at the target instead of writing through it
            os.rename(tmp, parts[-1], src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except IsADirectoryError:
            os.unlink(tmp, dir_fd=dir_fd)
            raise SandboxPathError(f"{path!r} is a directory in the workspace") from None
        finally:
            os.close(dir_fd)

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        parts = _relative_parts(path)
        dir_fd = self._open_dir(parts[:-1], path, create=False)
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, f"no file {path!r} in the sandbox workspace") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise SandboxPathError(f"{path!r} is a symlink; symlinks are not followed") from None
            raise
        finally:
            os.close(dir_fd)
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise SandboxPathError(f"{path!r} is not a regular file")
            # all in the workspace belongs to the sandbox uid; anything else is a hard link to a host file
            if running_as_root() and info.st_uid != self.uid:
                raise SandboxPathError(f"{path!r} is not a file the sandbox created")
            return handle.read() if max_bytes is None else handle.read(max_bytes)

    def put_io(self, prefix: str, data: bytes) -> Path:
        """A file in the io directory, readable (not writable) by the sandbox."""
        target = self.io_dir / f"{prefix}-{secrets.token_hex(8)}"
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        return target

    # -- lifecycle ----------------------------------------------------------------------------------------
    def kill_processes(self) -> None:
        kill_uid(self.uid)

    def wipe(self) -> None:
        """Empty the workspace and io directory in place (live bind mounts keep pointing at them)."""
        clear_directory(self.path)
        clear_directory(self.io_dir)
        self._own(self.path)
        os.chmod(self.path, 0o700)

    def release(self) -> None:
        """Kill the slot's processes, delete its directory and unlock it. Safe to call twice."""
        lock_fd, self._lock_fd = self._lock_fd, None
        if lock_fd is not None:
            _release_slot(self.root, lock_fd, self.slot)

    # -- helpers ------------------------------------------------------------------------------------------
    def _own(self, path: Path) -> None:
        if running_as_root():
            os.chown(path, self.uid, self.gid, follow_symlinks=False)

    def _open_dir(self, parts: tuple[str, ...], shown: str, create: bool) -> int:
        """Walk `parts` from the workspace one directory at a time, refusing symlinks at every step."""
        fd = os.open(self.path, _DIR_FLAGS)
        try:
            for part in parts:
                try:
                    next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        message = f"no directory for {shown!r} in the workspace"
                        raise FileNotFoundError(errno.ENOENT, message) from None
                    os.mkdir(part, 0o755, dir_fd=fd)
                    next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                    if running_as_root():
                        os.fchown(next_fd, self.uid, self.gid)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        message = f"{shown!r}: {part!r} is a symlink or not a directory"
                        raise SandboxPathError(message) from None
                    raise
                os.close(fd)
                fd = next_fd
        except BaseException:
            os.close(fd)
            raise
        return fd
