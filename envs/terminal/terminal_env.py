"""A sandboxed shell task with a completion check (the Endless Terminals protocol)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from rl_llm import checks
from rl_llm.envs.base import Outcome, Task, TextEnv, checked_task_index
from rl_llm.envs.parsing import extract_tag, truncate_middle
from rl_llm.envs.terminal import TerminalTask, generate_task, is_task_dir, load_task_dir, load_task_folder
from rl_llm.envs.terminal.protocol import RUNNER_COMMAND, parse_verdict, runner_program
from rl_llm.sandboxes import BACKENDS, Sandbox, SandboxError, make, resolve_backend

INVALID_ACTION = (
    "Could not parse a single <command>...</command> or <action>done</action>. "
    "Please respond with exactly one of those."
)
SYSTEM_PROMPT = (
    "You are a Linux terminal agent operating strictly via a single-shell-command interface. Each turn, you may "
    "think inside <think>...</think>, then reply with exactly one of: <command>THE_SINGLE_SHELL_COMMAND</command> "
    "to run one command in a persistent bash shell (the working directory and variables carry over; your home "
    "directory is where the shell starts), or <action>done</action> when the task is complete. If a turn holds "
    "several <command> blocks, only the last one runs; a turn with a <command> and <action>done</action> runs the "
    "command, then ends the episode. You have at most {max_turns} turns and {budget:g} seconds; "
    "each command is interrupted after {timeout:g} seconds. There is no network access and nothing is "
    "interactive. When you finish, automated tests check the final state of the system."
)
MAX_COMMAND_CHARS = 100_000
TRUNCATION_NOTE = "[... {n} characters of output truncated ...]"
DOCKER_IMAGE = "terminal"  # sandboxes/images/terminal.Dockerfile
GENERATED_TASKS = 2**31  # seeds of the procedural generator; task_index i is the task of seed i


class GeneratedTasks(Sequence[TerminalTask]):
    """The procedural task set as a sequence: item ``i`` is ``generate_task(i, family, difficulty)``."""

    def __init__(self, family: str | Sequence[str] | None, difficulty: int | Sequence[int] | None) -> None:
        generate_task(0, family, difficulty)  # validates the filters now, not at the first reset
        self.family, self.difficulty = family, difficulty

    def __len__(self) -> int:
        return GENERATED_TASKS

    def __getitem__(self, index: int) -> TerminalTask:  # type: ignore[override]
        if not 0 <= index < GENERATED_TASKS:
            raise IndexError(f"task index {index} out of range [0, {GENERATED_TASKS})")
        return generate_task(index, self.family, self.difficulty)


def parse_turn(text: str) -> tuple[str | None, bool] | None:
    """(the command to run, or None; whether the turn says done), or None when it holds neither action.

    The last ``<command>`` runs. A turn with both a command and ``<action>done</action>`` (in any order)
    runs the command, then finishes: the agent meant both, and dropping the command would check a state
    the agent did not ask for. An empty command beside ``done`` is no command."""
    command = extract_tag(text, "command", last=True)
    done = (extract_tag(text, "action", last=True) or "").lower() == "done"
    if command is None and not done:
        return None
    if done and command is not None and not command.strip():
        command = None
    return command, done


def format_output(output: str, exit_code: int, max_chars: int) -> str:
    shown = truncate_middle(output, max_chars, TRUNCATION_NOTE)
    verdict = "Command executed successfully." if exit_code == 0 else "Command failed."
    return f"{verdict} Output: {shown}\n\n(exit_code={exit_code})"


class TerminalEnv(TextEnv):
    """
    ## Description
    The agent completes a task in a sandboxed Linux shell (a persistent bash from ``rl_llm.sandboxes``;
    home and starting directory ``/workspace``; no network). Tasks come from a procedural generator of ten
    families (files, logs, data, text, scripting, permissions, archives, config, git, sqlite) at three
    difficulty levels, or from hand-written task directories. After the episode a completion check runs in
    the same sandbox; the check and its expected values never enter the workspace, so the agent can neither
    read nor edit them (they are piped to a checker process once the agent's shell and all its processes
    are gone).

    ## Observation
    On reset, the task description. After a command:
    ``Command executed successfully. Output: {stdout+stderr}\\n\\n(exit_code=0)`` or
    ``Command failed. Output: ...\\n\\n(exit_code=N)`` (124 on a timeout, which interrupts the command);
    long output keeps its head and tail with a note saying how much was cut. An unparseable turn gets
    "Could not parse a single <command>...</command> or <action>done</action>. ...".

    ## Action
    One turn: ``<command>ONE SHELL COMMAND</command>`` (if there are several, the last one counts) or
    ``<action>done</action>``; a turn with both runs the command, then ends the episode.

    ## Rewards
    ``completion``: 1.0 on the final step if every completion check passes on the final state, else 0.0.
    ``info["check"]`` holds ``{"passed", "message"}``; ``info["metrics"]``: ``passed``, ``commands``,
    ``failed_commands``, ``timeouts``. ``env.unwrapped.sandbox_seconds`` is the time this episode spent in
    sandbox calls (kept out of ``info`` so that equal seeds give equal infos).

    ## Episode End
    Terminated on ``<action>done</action>`` (after the turn's command, if any; then the check runs), or
    when the wall-clock budget ``time_budget_s`` is spent (no check, reward 0,
    ``info["time_budget_exceeded"]``). Truncated after ``max_turns`` turns; the check still runs on that
    last turn.

    ## Arguments
    - ``task_family`` (None: all): a family name or list of names (``FAMILIES``).
    - ``difficulty`` (None: 1-3 at random): 1, 2, 3 or a list of them.
    - ``tasks`` (None: generated): a folder of task directories, one task directory, or TerminalTasks.
    - ``sandbox`` ("auto"): a backend name for ``rl_llm.sandboxes.make`` (docker uses the ``terminal``
      image unless ``sandbox_kwargs`` names another), a ``Sandbox`` (not closed by the env), or a
      ``SandboxPool`` (one sandbox acquired per episode; build it with ``image="terminal"`` for docker).
    - ``max_turns`` (16), ``time_budget_s`` (600), ``command_timeout_s`` (30), ``max_output_chars``
      (50,000), ``check_timeout_s`` (120; also bounds the setup), ``sandbox_kwargs`` (limits and
      options for ``make``, e.g. ``{"memory_mb": 2048}``).
    - reset options: ``task`` (a TerminalTask or a task directory path), ``task_index``, ``task_family``,
      ``difficulty``.

    ## Version History
    - v0.1: a turn with a command and ``done`` runs the command, then finishes (the command was dropped);
      the bwrap workspace survives ``chmod -R 000``, immutable flags and deep nesting at reset.
    - v0: initial release.
    """

    reset_options = frozenset({"task", "task_index", "task_family", "difficulty"})

    stop = ("</command>", "</action>")

    def __init__(
        self,
        task_family: str | Sequence[str] | None = None,
        difficulty: int | Sequence[int] | None = None,
        tasks: str | Path | Sequence[TerminalTask] | None = None,
        sandbox: Any = "auto",
        max_turns: int = 16,
        time_budget_s: float = 600.0,
        command_timeout_s: float = 30.0,
        max_output_chars: int = 50_000,
        check_timeout_s: float = 120.0,
        sandbox_kwargs: dict[str, Any] | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self.time_budget_s = checks.seconds("time_budget_s", time_budget_s)
        self.command_timeout_s = checks.seconds("command_timeout_s", command_timeout_s)
        self.check_timeout_s = checks.seconds("check_timeout_s", check_timeout_s)
        self.max_output_chars = checks.integer("max_output_chars", max_output_chars, minimum=1)
        self.task_family, self.difficulty = task_family, difficulty
        self.tasks: Sequence[TerminalTask] = self._task_set(tasks, task_family, difficulty)
        self._sandbox_spec = _checked_sandbox(sandbox)
        if sandbox_kwargs is not None and not isinstance(sandbox_kwargs, Mapping):
            raise ValueError(f"sandbox_kwargs must be a dict of sandbox options, got {sandbox_kwargs!r}")
        self._sandbox_kwargs = dict(sandbox_kwargs or {})
        self._sandbox: Any = None  # the sandbox of the current episode
        self._owned: Any = None  # a sandbox this env made (reused across episodes, closed by close())
        self._lease: AbstractContextManager | None = None  # a pool's acquire() while an episode holds one
        self._session: Any = None
        self._dirty = False
        self.current_task: TerminalTask | None = None
        self.sandbox_seconds = 0.0
        self.commands = self.failed_commands = self.timeouts = 0
        self._started = 0.0

    @staticmethod
    def _task_set(tasks: Any, family: Any, difficulty: Any) -> Sequence[TerminalTask]:
        if tasks is None:
            return GeneratedTasks(family, difficulty)
        if isinstance(tasks, (str, Path)):
            path = Path(tasks)
            return [load_task_dir(path)] if is_task_dir(path) else load_task_folder(path)
        found = list(tasks) if isinstance(tasks, Iterable) else []  # tasks=123 was "'int' is not iterable"
        if not found or not all(isinstance(task, TerminalTask) for task in found):
            raise TypeError("tasks must be a folder path or a non-empty sequence of TerminalTask")
        return found

    # -- sandbox handling ---------------------------------------------------------------------------------
    def _acquire_sandbox(self) -> Any:
        spec = self._sandbox_spec
        if hasattr(spec, "acquire"):  # a SandboxPool: it resets the sandbox when we give it back
            self._lease = spec.acquire()
            return self._lease.__enter__()
        if isinstance(spec, str):
            if self._owned is None or self._owned.closed:
                options = dict(self._sandbox_kwargs)
                if resolve_backend(spec) == "docker":  # the image with git, sqlite3 and friends
                    options.setdefault("image", DOCKER_IMAGE)
                self._owned = make(spec, keep_warm=True, **options)
                self._dirty = False
            sandbox = self._owned
        else:
            sandbox = spec
        if self._dirty:
            sandbox.reset()
        self._dirty = True
        return sandbox

    def _release_sandbox(self) -> None:
        self._close_session()
        lease, self._lease = self._lease, None
        self._sandbox = None
        if lease is not None:
            lease.__exit__(None, None, None)

    def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()  # ends the agent's shell and every process in its namespace

    def _timed(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            self.sandbox_seconds += time.perf_counter() - started

    def _runner(self, payload: dict[str, Any], timeout: float) -> tuple[bool, str]:
        program, nonce = runner_program(payload)
        result = self._timed(self._sandbox.run, RUNNER_COMMAND, timeout=timeout, stdin=program)
        verdict = parse_verdict(result.stdout, nonce)
        if verdict is None:
            why = "timed out" if result.timed_out else f"exit status {result.exit_code}"
            return False, f"the checker did not report ({why}): {result.stderr.strip()[-300:]}"
        return verdict

    # -- episode --------------------------------------------------------------------------------------------
    def _pick_task(self, options: dict[str, Any]) -> TerminalTask:
        if "task" in options:
            task = options["task"]
            if isinstance(task, (str, Path)):
                try:
                    return load_task_dir(task)
                except OSError as error:  # the caller's option names no readable task: bad input, not a crash
                    raise ValueError(f"options['task']: {error}") from None
            if not isinstance(task, TerminalTask):
                raise TypeError(f"options['task'] must be a TerminalTask or a task directory, got {type(task).__name__}")
            return task
        if "task_family" in options or "difficulty" in options:
            drawn = int(self.np_random.integers(GENERATED_TASKS))  # drawn either way: same stream as before
            index = options.get("task_index")
            # task_index is the generator's seed here, held to the same range and type as below (a float, a
            # string, None or -1 used to reach int() or the generator unchecked).
            seed = drawn if index is None else checked_task_index(index, GENERATED_TASKS)
            family = options.get("task_family", self.task_family)
            return generate_task(seed, family, options.get("difficulty", self.difficulty))
        index = options.get("task_index")
        if index is None:
            index = int(self.np_random.integers(len(self.tasks)))
        return self.tasks[checked_task_index(index, len(self.tasks))]

    def _reset(self, options: dict[str, Any]) -> Task:
        task = self._pick_task(options)
        self._release_sandbox()
        self.current_task = task
        self.sandbox_seconds = 0.0
        self.commands = self.failed_commands = self.timeouts = 0
        self._sandbox = self._timed(self._acquire_sandbox)
        ready, message = self._runner(task.setup_payload(), self.check_timeout_s)
        if not ready:
            self._release_sandbox()
            raise RuntimeError(f"task {task.task_id}: the workspace setup failed: {message}")
        self._session = self._timed(self._sandbox.session)
        self._started = time.monotonic()
        system_prompt = SYSTEM_PROMPT.format(
            max_turns=self.max_turns, budget=self.time_budget_s, timeout=self.command_timeout_s
        )
        info = {"family": task.family, "difficulty": task.difficulty, "variant": task.variant}
        return Task(observation=task.description, task_id=task.task_id, system_prompt=system_prompt, info=info)

    def _step(self, action: str) -> Outcome:
        if self._session is None:
            raise RuntimeError("TerminalEnv: the last reset failed, so there is no episode; call reset()")
        parsed = parse_turn(action)
        last_turn = self.turn >= self.max_turns
        invalid = parsed is None or (parsed[0] is not None and not parsed[0].strip())
        if invalid or parsed is None:
            observation = INVALID_ACTION
        elif parsed[0] is None:  # done alone
            return self._finish("You ended the episode.", terminated=True)
        else:
            observation = self._execute(parsed[0])
        if time.monotonic() - self._started > self.time_budget_s:
            return self._out_of_time()
        if parsed is not None and parsed[1] and not invalid:  # a command, then done
            return self._finish(f"{observation}\n\nYou ended the episode.", terminated=True)
        if last_turn:
            return self._finish(observation + "\n\nThat was the last turn.", terminated=False, invalid=invalid)
        return Outcome(observation, {"completion": 0.0}, invalid_action=invalid, metrics=self._metrics(None))

    def _execute(self, command: str) -> str:
        if "\0" in command:
            return "Command failed. Output: the command contains a NUL byte, which a shell cannot run.\n\n(exit_code=2)"
        if len(command) > MAX_COMMAND_CHARS:
            return f"Command failed. Output: the command is longer than {MAX_COMMAND_CHARS} characters.\n\n(exit_code=2)"
        command = command.encode("utf-8", "replace").decode("utf-8")  # lone surrogates cannot reach bash
        remaining = self.time_budget_s - (time.monotonic() - self._started)
        timeout = max(0.01, min(self.command_timeout_s, remaining))
        self.commands += 1
        try:
            result = self._timed(self._session.run, command, timeout=timeout)
        except SandboxError as exc:  # the shell could not be (re)started: give the agent a new one
            self.failed_commands += 1
            self._close_session()
            self._session = self._timed(self._sandbox.session)
            return f"Command failed. Output: {exc}\n\n(exit_code=1)"
        output = result.output
        if result.timed_out:
            self.timeouts += 1
            output += f"\n[the command timed out after {timeout:g} seconds and was interrupted]"
        if result.truncated:
            output += "\n[the sandbox also capped this output]"
        self.failed_commands += result.exit_code != 0
        return format_output(output, result.exit_code, self.max_output_chars)

    def _finish(self, message: str, *, terminated: bool, invalid: bool = False) -> Outcome:
        """Stop the agent's shell, run the completion check, and score the episode."""
        assert self.current_task is not None
        self._close_session()
        # Also what the agent detached from its shell (setsid, nohup), which on docker and local outlives the
        # session: the check must see a settled state.
        self._timed(self._sandbox.kill_processes)
        passed, detail = self._runner({"mode": "check", "checks": list(self.current_task.checks)}, self.check_timeout_s)
        self._release_sandbox()
        verdict = "The completion check passed." if passed else "The completion check failed."
        return Outcome(
            f"{message}\n{verdict}",
            {"completion": 1.0 if passed else 0.0},
            terminated=terminated,
            invalid_action=invalid,
            metrics=self._metrics(passed),
            info={"check": {"passed": passed, "message": detail}},
        )

    def _out_of_time(self) -> Outcome:
        self._release_sandbox()
        return Outcome(
            f"The wall-clock budget of {self.time_budget_s:g} seconds is spent; the task was not checked.",
            {"completion": 0.0},
            terminated=True,
            metrics=self._metrics(False),
            info={"time_budget_exceeded": True, "check": {"passed": False, "message": "time budget exceeded"}},
        )

    def _metrics(self, passed: bool | None) -> dict[str, float]:
        return {
            "passed": float(bool(passed)),
            "commands": float(self.commands),
            "failed_commands": float(self.failed_commands),
            "timeouts": float(self.timeouts),
        }

    def close(self) -> None:
        self._release_sandbox()
        owned, self._owned = self._owned, None
        if owned is not None:
            owned.close()
        super().close()


def _checked_sandbox(spec: Any) -> Any:
    """``sandbox`` as given, once it is something a sandbox can come from: None or a number passed
    ``gym.make`` and failed at the first reset with an ``AttributeError``."""
    usable = spec in ("auto", *BACKENDS) if isinstance(spec, str) else isinstance(spec, Sandbox) or hasattr(spec, "acquire")
    if not usable:
        raise ValueError(f"sandbox must be 'auto', a backend name {list(BACKENDS)}, a Sandbox or a SandboxPool, got "
                         f"{type(spec).__name__} {spec!r}")  # fmt: skip
    return spec
