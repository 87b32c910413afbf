"""rl_llm.sandboxes: isolated execution of model-written code and shell commands.

    from rl_llm.sandboxes import make, SandboxPool

    with make(backend="auto", wall_timeout=10, memory_mb=512) as sb:   # docker, else bwrap, else an error
        res = sb.run("echo hi")                  # ExecResult(stdout, stderr, exit_code, timed_out, ...)
        sb.write_file("main.py", "print(6 * 7)")
        res = sb.run(["python3", "main.py"])     # argv list: no shell
        res = sb.run_python("print(1 + 1)")
        with sb.session() as sh:                 # persistent bash: cwd and variables carry over
            sh.run("cd /tmp && export X=1"); sh.run("echo $X $PWD")
        sb.kill_processes()                      # sessions end, detached processes too; files stay

    pool = SandboxPool(size=8)
    with pool.acquire() as sb: ...               # reset (processes killed, workspace wiped) on release

Backends: `bwrap` (bubblewrap namespaces + rlimits), `docker` (a container per sandbox, images built from
sandboxes/images/), `local` (rlimits only, UNSAFE, only when asked for by name).
"""

from rl_llm.sandboxes.base import (
    QUOTA_EXIT_CODE,
    TIMEOUT_EXIT_CODE,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxPathError,
    SandboxUnavailable,
)
from rl_llm.sandboxes.factory import BACKENDS, available_backends, backend_problem, make, resolve_backend
from rl_llm.sandboxes.pool import SandboxPool
from rl_llm.sandboxes.shell import ShellSession
from rl_llm.sandboxes.workspace import cleanup_stale

__all__ = [
    "BACKENDS",
    "QUOTA_EXIT_CODE",
    "TIMEOUT_EXIT_CODE",
    "ExecResult",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxPathError",
    "SandboxPool",
    "SandboxUnavailable",
    "ShellSession",
    "available_backends",
    "backend_problem",
    "cleanup_stale",
    "make",
    "resolve_backend",
]
