"""Reading child output: capped capture that keeps draining, end-marker search, and a select loop."""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import time
from collections.abc import Callable


class StreamCapture:
    """The bytes of one stream, kept up to `cap` while everything beyond is read and counted, never stored.

    With a `marker`, the stream ends where the marker first appears (it may straddle reads); bytes after it
    are kept in `after` for whoever reads next.
    """

    def __init__(self, cap: int, marker: bytes | None = None) -> None:
        self.cap = cap
        self.kept = bytearray()
        self.total = 0
        self.marker = marker
        self.found = False
        self.eof = False
        self.after = bytearray()
        self._pending = b""  # the last len(marker)-1 bytes, which may be the start of a marker
        self.retired: list[bytes] = []

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def on_read(self, data: bytes) -> None:
        """FdPump handler: data, or b"" at end of file."""
        if data:
            self.feed(data)
        else:
            self.eof = True
            self._keep(self._pending)
            self._pending = b""

    def feed(self, data: bytes) -> None:
        if self.found or self.marker is None:
            if self.found:
                self.after += data[: max(0, self.cap - len(self.after))]
            else:
                self._keep(data)
            return
        buffer = self._pending + data
        at = buffer.find(self.marker)
        if at >= 0:
            self._keep(buffer[:at])
            self._pending = b""
            self.found = True
            self.after += buffer[at + len(self.marker):][: self.cap]
            return
        safe = max(0, len(buffer) - len(self.marker) + 1)
        self._keep(buffer[:safe])
        self._pending = buffer[safe:]

    def retarget(self, marker: bytes) -> None:
        """Look for another marker from here on (after an interrupt); bytes after an old one count again."""
        rest = bytes(self.after) if self.found else self._pending
        if self.marker is not None:
            self.retired.append(self.marker)
        self.marker, self.found, self.after, self._pending = marker, False, bytearray(), b""
        if rest:
            self.feed(rest)

    def text(self) -> str:
        """The kept bytes as text, without markers this capture stopped waiting for (printed late)."""
        data = bytes(self.kept)
        for marker in self.retired:
            data = data.replace(marker, b"")
        return data.decode("utf-8", errors="replace")

    def _keep(self, data: bytes) -> None:
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += data[:room]
        self.total += len(data)


class FdPump:
    """A select loop over pipe read ends (handlers get b"" once at EOF) and at most one pending write."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._handlers: dict[int, Callable[[bytes], None]] = {}
        self._write_fd: int | None = None
        self._write_data = memoryview(b"")
        self._watches: dict[int, Callable[[], None]] = {}

    def add(self, fd: int, handler: Callable[[bytes], None]) -> None:
        os.set_blocking(fd, False)
        self._handlers[fd] = handler
        self._selector.register(fd, selectors.EVENT_READ)

    def watch(self, fd: int, callback: Callable[[], None]) -> None:
        """Call `callback` once when `fd` becomes readable, without reading it (a pidfd: process ended)."""
        self._watches[fd] = callback
        self._selector.register(fd, selectors.EVENT_READ)

    def write_all(self, fd: int, data: bytes) -> None:
        """Queue `data` for `fd` and close `fd` once written (used for a child's stdin)."""
        os.set_blocking(fd, False)
        self._write_fd, self._write_data = fd, memoryview(data)
        self._selector.register(fd, selectors.EVENT_WRITE)

    @property
    def reading(self) -> bool:
        return bool(self._handlers)

    def run(self, until: Callable[[], bool], deadline: float | None) -> bool:
        """Serve reads and the write until `until()` holds (True), or the deadline passes / all fds close."""
        while not until():
            if not self._handlers:
                return until()
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return False
            for key, _ in self._selector.select(wait):
                if key.fd == self._write_fd:
                    self._write_some()
                elif key.fd in self._watches:
                    self._selector.unregister(key.fd)
                    self._watches.pop(key.fd)()
                else:
                    self._read(key.fd)
        return True

    def close(self) -> None:
        self._finish_write()
        for fd in list(self._handlers):
            self._drop(fd)
        for fd in list(self._watches):
            self._selector.unregister(fd)
        self._watches.clear()
        self._selector.close()

    def _read(self, fd: int) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno != errno.EIO:
                raise
            data = b""
        handler = self._handlers[fd]
        if not data:
            self._drop(fd)
        handler(data)

    def _drop(self, fd: int) -> None:
        self._handlers.pop(fd, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(fd)

    def _write_some(self) -> None:
        assert self._write_fd is not None
        try:
            written = os.write(self._write_fd, self._write_data[: 1 << 16])
        except BlockingIOError:
            return
        except (BrokenPipeError, ConnectionResetError):  # the child stopped reading its stdin: fine
            written = len(self._write_data)
        self._write_data = self._write_data[written:]
        if not self._write_data:
            self._finish_write()

    def _finish_write(self) -> None:
        if self._write_fd is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(self._write_fd)
            with contextlib.suppress(OSError):
                os.close(self._write_fd)
            self._write_fd = None
