"""The local backend: plain subprocesses with rlimits. UNSAFE: no filesystem, network or PID isolation.

Commands run on the host, in the workspace directory, with a clean environment and the same rlimits as the
other backends (as the slot's private uid when the host process is root, which also makes the process limit
bind). They can read whatever that user can read and reach the network. Use it only for trusted code or where
neither bwrap nor docker can run, and only by asking for `backend="local"` explicitly.
"""

from __future__ import annotations

import functools
import os
import secrets

from rl_llm.sandboxes.base import Command, ExecResult, Sandbox, SandboxLimits, sandbox_env
from rl_llm.sandboxes.oneshot import run_to_completion
from rl_llm.sandboxes.processes import kill_by_environ, kill_group
from rl_llm.sandboxes.shell import DRIVER_ARGV, ShellProcess, spawn_popen_shell
from rl_llm.sandboxes.workspace import Workspace, as_user, clear_directory, log, running_as_root

MARKER_VAR = "RL_LLM_SANDBOX_ID"


class LocalSandbox(Sandbox):
    """Subprocesses with rlimits only; see the module docstring for what it does not protect."""

    backend = "local"

    def __init__(self, limits: SandboxLimits, *, env: dict[str, str] | None = None,
                 keep_warm: bool = False) -> None:
        super().__init__(limits, Workspace(), keep_warm)
        ws = self._workspace
        self.inner_workdir = str(ws.path)
        self._tmp = tmp = ws.root / "tmp"
        tmp.mkdir(mode=0o700)
        if running_as_root():
            os.chown(tmp, ws.uid, ws.gid)
        # Without root there is no uid of the sandbox's own to kill (see `_kill_all`); its processes are then
        # found by an environment entry they all inherit, unique to this sandbox.
        token = secrets.token_hex(8)
        self._env = sandbox_env(str(ws.path), {"PATH": os.environ.get("PATH", os.defpath), "TMPDIR": str(tmp),
                                               **(env or {}), MARKER_VAR: token})
        self._prefix = as_user(ws.uid)
        self._marker = None if running_as_root() else f"{MARKER_VAR}={token}"
        if self._marker is not None:
            self._res.extra_cleanup.append(functools.partial(kill_by_environ, self._marker))
        log.warning("UNSAFE local sandbox at %s: commands run on the host with rlimits only (no filesystem, "
                    "network or process isolation)", ws.path)
        if keep_warm:
            self._start_warm()

    def _inner_io_dir(self) -> str:
        return str(self._workspace.io_dir)

    def _wipe_private_dirs(self) -> None:
        clear_directory(self._tmp)
        os.chmod(self._tmp, 0o700)

    def _run(self, cmd: Command, timeout: float, stdin: bytes | None, env: dict[str, str]) -> ExecResult:
        # Background jobs stay in the command's process group; kill it when the command returns.
        return run_to_completion([*self._prefix, *self._shell_argv(cmd)], env={**self._env, **env},
                                 cwd=str(self.workdir), stdin=stdin, timeout=timeout,
                                 cap=self.limits.max_output_bytes, kill=kill_group, on_exit=kill_group,
                                 pipe_owner=self._workspace.uid)

    def _kill_all(self) -> bool:
        if self._marker is None:
            return super()._kill_all()  # every process of the slot's private uid
        kill_by_environ(self._marker)
        return True

    def spawn_shell(self) -> ShellProcess:
        return spawn_popen_shell([*self._prefix, *DRIVER_ARGV], env=self._env, cwd=str(self.workdir),
                                 limits=self.limits, workdir=str(self.workdir),
                                 pipe_owner=self._workspace.uid)
