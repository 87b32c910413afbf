"""rl-llm's tool environments as TRL ``environment_factory`` classes: their tools are the class's methods.

TRL's ``GRPOTrainer(environment_factory=Cls)`` (TRL >= 1.x, transformers >= 5.2) builds one environment
per rollout, turns every public method into a tool for the model's native tool calling (name, type hints and
docstring give the JSON schema), calls ``reset(**row)`` before generation and appends what it returns to the
prompt, and scores the rollout with ``get_reward()``. Here each tool call is turned into the rl-llm env's own
action (``<tool_call>{...}</tool_call>``, ``<search>``, ``<sql>``, ``<command>``) and stepped, so the
environment, its tools, its sandbox and its reward are exactly rl-llm's::

    from trl import GRPOConfig, GRPOTrainer
    from rl_llm.integrations.trl_env import ToolCallsEnvironment, make_tool_dataset

    trainer = GRPOTrainer(
        model=model_dir, args=GRPOConfig(...),
        train_dataset=make_tool_dataset(seeds=range(256)),
        environment_factory=ToolCallsEnvironment,           # or environment(ToolCallsEnvironment, top_k=5)
    )

The model ends an episode by calling its final tool (``answer``, ``submit_sql``, ``finish``); the reward is
the episode's return in the env (0 when it never finished, ``None``, unscored, when the env raised). ``reset``
reads the row's ``rl_llm_task`` (``{"seed", "options"}`` as JSON, written by ``make_tool_dataset``) so every
row is a reproducible task.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from rl_llm import checks
from rl_llm.integrations.generic import MessageEnv, checked_mapping, parse_task

TASK_KEY = "rl_llm_task"
ENDED = "The episode is over; no more tool calls are needed."


class RLLMToolEnvironment:
    """Base class: one rl-llm env stepped by tool calls. Subclasses add the tools (public methods).

    TRL turns every public method into a tool, so everything that is not a tool here is private.
    """

    env_id: ClassVar[str] = ""
    default_kwargs: ClassVar[dict[str, Any]] = {}
    instructions: ClassVar[str] = ""

    def __init__(self, **env_kwargs: Any) -> None:
        from rl_llm.integrations.social_seat import make_env

        self._env = MessageEnv(make_env(self.env_id, **{**self.default_kwargs, **env_kwargs}))
        self._return = 0.0
        self._done = True
        self._failed = False  # the env raised during this episode: its return is no score
        self._last_info: dict[str, Any] = {}

    def reset(self, rl_llm_task: str | Mapping[str, Any] | None = None, **_: Any) -> str:
        """Start the row's episode; the task text is appended to the prompt."""
        task = json.loads(rl_llm_task) if isinstance(rl_llm_task, str) else rl_llm_task
        seed, options = parse_task(task)
        messages = self._env.reset({"seed": seed, "options": options})
        self._return, self._done, self._failed, self._last_info = 0.0, False, False, {}
        return f"{messages[-1]['content']}\n\n{self.instructions}".rstrip()

    def get_reward(self) -> float | None:
        """The episode's return in the rl-llm env (what TRL's GRPO optimizes); ``None`` (unscorable) when the env
        raised during the episode."""
        return None if self._failed else self._return

    def _act(self, action: str) -> str:
        """Step the env with one action text; the observation goes back to the model as the tool's result."""
        if self._done:
            return ENDED
        try:
            observation, reward, done, info = self._env.step(action)
        except Exception as error:
            # An env error ends this episode only (docs/design.md#agents-and-the-episode-loop): TRL turns the raise
            # into the tool's error message, later calls get ENDED instead of stepping a broken env, and the
            # partial return is not passed off as the episode's score (None: GRPO leaves it unscored, as the
            # rollout_func adapter, integrations/trl.py, does for failed episodes).
            self._done, self._failed = True, True
            raise RuntimeError(f"the environment failed; the episode is over: {error!r}") from error
        self._return += reward
        self._done, self._last_info = done, info
        if done:
            return ENDED
        return observation[-1]["content"] if observation else ""

    def _close(self) -> None:
        self._env.close()


class AnswerTool(RLLMToolEnvironment):
    """The ``answer`` tool shared by the question-answering environments (TRL collects inherited methods)."""

    def answer(self, answer: str) -> str:
        """Submit the final answer; this ends the episode.

        Args:
            answer: The final answer, as short as possible.
        """
        return self._act(f"<answer>{answer}</answer>")


class ToolCallsEnvironment(AnswerTool):
    """``rl-llm/ToolCalls-v0``: search a knowledge base, compute, run Python, then answer."""

    env_id = "rl-llm/ToolCalls-v0"
    instructions = "Use the tools to find and compute what is needed, then call `answer` with the final answer."

    def _call(self, name: str, argument: str, value: str) -> str:
        return self._act("<tool_call>" + json.dumps({"name": name, "arguments": {argument: value}}) + "</tool_call>")

    def search(self, query: str) -> str:
        """Search the knowledge base and return the top passages.

        Args:
            query: What to look for.
        """
        return self._call("search", "query", query)

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression (+ - * / ** %, abs, round, min, max, sqrt, log, exp, floor, ceil).

        Args:
            expression: The expression, e.g. "round(3.5 * 2, 1)".
        """
        return self._call("calculator", "expression", expression)

    def python(self, code: str) -> str:
        """Run Python code in a sandbox and return what it prints.

        Args:
            code: The program; print the values you need.
        """
        return self._call("python", "code", code)


class SearchEnvironment(AnswerTool):
    """``rl-llm/Search-v0``: Search-R1 style question answering over a retrieval corpus."""

    env_id = "rl-llm/Search-v0"
    instructions = "Search as often as you need, then call `answer` with the final answer."

    def search(self, query: str) -> str:
        """Search the corpus and return the top passages.

        Args:
            query: The search query.
        """
        return self._act(f"<search>{query}</search>")



class TextToSQLEnvironment(RLLMToolEnvironment):
    """``rl-llm/TextToSQL-v0`` (multi-turn mode): explore the database with queries, then submit one."""

    env_id = "rl-llm/TextToSQL-v0"
    default_kwargs: ClassVar[dict[str, Any]] = {"mode": "multi"}
    instructions = "Explore the database with `run_sql` if needed, then call `submit_sql` with your final query."

    def run_sql(self, query: str) -> str:
        """Run a read-only SQL query on the database and return its result.

        Args:
            query: One SQLite SELECT statement.
        """
        return self._act(f"<sql>{query}</sql>")

    def submit_sql(self, query: str) -> str:
        """Submit the final SQL query answering the question; this ends the episode.

        Args:
            query: One SQLite SELECT statement.
        """
        return self._act(f"<solution>{query}</solution>")


class TerminalEnvironment(RLLMToolEnvironment):
    """``rl-llm/Terminal-v0``: a shell task in a sandbox, checked when the model calls ``finish``."""

    env_id = "rl-llm/Terminal-v0"
    instructions = "Run shell commands with `run`; call `finish` when the task is complete."

    def run(self, command: str) -> str:
        """Run one shell command in the task's workspace and return its output and exit status.

        Args:
            command: A single bash command line.
        """
        return self._act(f"<command>{command}</command>")

    def finish(self) -> str:
        """Declare the task complete; the final state is checked and the episode ends."""
        return self._act("<action>done</action>")


ENVIRONMENTS: dict[str, type[RLLMToolEnvironment]] = {
    cls.env_id: cls for cls in (ToolCallsEnvironment, SearchEnvironment, TextToSQLEnvironment, TerminalEnvironment)
}


def environment(cls: type[RLLMToolEnvironment] | str, **env_kwargs: Any) -> Callable[[], RLLMToolEnvironment]:
    """An ``environment_factory`` building ``cls`` (or the class for an env id) with the env's kwargs."""
    if isinstance(cls, str):
        if cls not in ENVIRONMENTS:
            raise ValueError(f"no TRL tool environment for {cls!r}; choose from {sorted(ENVIRONMENTS)}")
        cls = ENVIRONMENTS[cls]
    return functools.partial(cls, **env_kwargs)


def make_tool_dataset(seeds: Iterable[int], options: Mapping[str, Any] | None = None,
                      instruction: str = "Solve the following task with the tools you are given.") -> Any:  # fmt: skip
    """A ``datasets.Dataset`` with a ``prompt`` (``reset`` appends the task) and ``rl_llm_task`` per seed."""
    from datasets import Dataset

    options = checked_mapping("options", options)
    rows = [
        {"prompt": [{"role": "user", "content": instruction + "\n\n"}],
         TASK_KEY: json.dumps({"seed": seed, "options": options})}
        for seed in checks.seed_list(seeds)
    ]  # fmt: skip
    return Dataset.from_list(rows)
