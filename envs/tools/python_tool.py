"""The python tool: code runs in an ``rl_llm.sandboxes`` sandbox (bubblewrap by default; no network)."""

from __future__ import annotations

from typing import Any

from rl_llm.errors import RLLMError


class ToolUnavailable(RLLMError, RuntimeError):
    """The tool cannot run here (no sandbox backend); the message says why."""


class PythonTool:
    """Runs agent code with ``sandbox.run_python``; the sandbox is made on first use and reused.

    ``backend`` and ``limits`` go to ``rl_llm.sandboxes.make``; ``timeout`` is the wall-clock limit per call.
    The output is not shortened here: the env that shows it applies its own limit to every tool's output.
    """

    def __init__(self, *, timeout: float = 5.0, backend: str = "auto", **limits: Any) -> None:
        self.timeout, self.backend, self.limits = timeout, backend, limits
        self._sandbox: Any = None

    def _ensure_sandbox(self) -> Any:
        if self._sandbox is None:
            try:
                from rl_llm.sandboxes import make
            except ImportError as exc:
                raise ToolUnavailable(f"rl_llm.sandboxes is not available ({exc})") from exc
            try:
                self._sandbox = make(backend=self.backend, **self.limits)
            except Exception as exc:  # no backend on this machine: report it to the agent, do not crash
                raise ToolUnavailable(f"no sandbox could be started ({type(exc).__name__}: {exc})") from exc
        return self._sandbox

    def run(self, code: str) -> str:
        """What the agent sees: stdout, then stderr and the exit status when the code failed."""
        sandbox = self._ensure_sandbox()
        try:
            result = sandbox.run_python(code, timeout=self.timeout)
        except (ValueError, TypeError) as exc:  # code the sandbox refuses to pass on (e.g. a NUL byte)
            return f"[not run: {exc}]"
        parts = [result.stdout] if result.stdout else []
        if result.timed_out:
            parts.append(f"[timed out after {self.timeout:g} s]")
        elif result.exit_code != 0:
            parts.append(f"[exit code {result.exit_code}]\n{result.stderr}".rstrip())
        if getattr(result, "truncated", False):
            parts.append("[output truncated]")
        return "\n".join(parts) if parts else "[no output: print the result]"

    def reset(self) -> None:
        """Fresh state between episodes (files written by earlier code are dropped)."""
        if self._sandbox is not None and hasattr(self._sandbox, "reset"):
            self._sandbox.reset()

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None
