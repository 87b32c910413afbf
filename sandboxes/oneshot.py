"""Running one command to completion: capped output that keeps draining, stdin fed without deadlock, and a
wall-clock limit after which the backend's kill takes the whole process tree down."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable

from rl_llm.sandboxes.base import TIMEOUT_EXIT_CODE, ExecResult
from rl_llm.sandboxes.processes import close_fds, exit_status, owned_pipe
from rl_llm.sandboxes.streams import FdPump, StreamCapture

# After the main process exits (or is killed), how long leftovers holding the pipes may keep them open.
DRAIN_GRACE_S = 0.5

Proc = subprocess.Popen[bytes]


def run_to_completion(argv: list[str], *, env: dict[str, str], cwd: str | None, stdin: bytes | None,
                      timeout: float, cap: int, kill: Callable[[Proc], None],
                      on_exit: Callable[[Proc], None] | None = None, new_session: bool = True,
                      pipe_owner: int | None = None,
                      on_start: Callable[[Proc], None] | None = None) -> ExecResult:
    """Run `argv` (in a new session, whose process group `kill` can use). `kill` must end everything it
    started; `on_exit` runs when the main process exits (the local backend kills its process group there,
    so background jobs release the pipes), `on_start` once it has started (bwrap keeps it, to kill it at a
    workspace quota stop). The stdio pipes belong to `pipe_owner`."""
    started = time.monotonic()
    out_read, out_write = owned_pipe(pipe_owner)
    err_read, err_write = owned_pipe(pipe_owner)
    in_read, in_write = owned_pipe(pipe_owner) if stdin is not None else (None, None)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL if in_read is None else in_read,
                                stdout=out_write, stderr=err_write, env=env, cwd=cwd,
                                start_new_session=new_session)
    except BaseException:
        close_fds(out_read, err_read, in_write)
        raise
    finally:
        close_fds(out_write, err_write, in_read)  # the child's ends
    if on_start is not None:
        on_start(proc)
    out, err = StreamCapture(cap), StreamCapture(cap)
    pump = FdPump()
    pump.add(out_read, out.on_read)
    pump.add(err_read, err.on_read)
    if in_write is not None:
        pump.write_all(in_write, stdin or b"")  # the pump closes it once written
    exited: list[float] = []
    pidfd = _pidfd(proc.pid)

    def main_exited() -> None:
        exited.append(time.monotonic())
        if on_exit is not None:
            on_exit(proc)

    if pidfd is not None:
        pump.watch(pidfd, main_exited)
    timed_out = False
    deadline = started + timeout
    try:
        while pump.reading:
            seen_exit = bool(exited)
            limit = min(deadline, exited[0] + DRAIN_GRACE_S) if exited else deadline
            if pump.run(lambda seen=seen_exit: not pump.reading or bool(exited) != seen, limit):
                continue  # all pipes closed, or the main process just exited: recompute the limit
            if timed_out or exited:  # leftovers (that escaped the kill) still hold the pipes: stop waiting
                break
            timed_out = True
            kill(proc)
            exited.append(time.monotonic())
            deadline = exited[0] + DRAIN_GRACE_S
    except BaseException:
        kill(proc)
        raise
    finally:
        pump.close()
        close_fds(pidfd, out_read, err_read)
    try:
        code = proc.wait(DRAIN_GRACE_S)
    except subprocess.TimeoutExpired:
        kill(proc)
        code = proc.wait()
    return ExecResult(stdout=out.text(), stderr=err.text(),
                      exit_code=TIMEOUT_EXIT_CODE if timed_out else exit_status(code), timed_out=timed_out,
                      duration_s=time.monotonic() - started, truncated=out.truncated or err.truncated)


def _pidfd(pid: int) -> int | None:
    with contextlib.suppress(AttributeError, OSError):
        return os.pidfd_open(pid)
    return None
