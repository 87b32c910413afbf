"""Tool-integrated reasoning with several tools: search, a calculator and a sandboxed python interpreter."""

from __future__ import annotations

import json
import os
from typing import Any

from rl_llm import checks
from rl_llm.envs.base import Outcome, Task, TextEnv
from rl_llm.envs.knowledge import TOOL_TASK_KINDS, ToolTask, bundled_kb
from rl_llm.envs.parsing import Block, ToolCall, parse_json_tool_calls, scan_blocks, truncate_middle
from rl_llm.envs.qa_scoring import numeric_or_exact_match
from rl_llm.envs.retrieval import Retriever, format_passages
from rl_llm.envs.retrieval.shared import (
    MAX_QUERY_CHARS,
    made_from_url,
    resolve_retriever,
    retrieve_or_explain,
)
from rl_llm.envs.tools import TOOLS, CalculatorError, PythonTool, ToolUnavailable, calculate, format_number
from rl_llm.envs.tools.specs import validate_arguments

MAX_BLOCKS_SCANNED = 64


class ToolCallsEnv(TextEnv):
    """
    ## Description
    Questions that need look-ups and/or computation, answered with tools: ``search`` over the bundled
    knowledge base, a safe ``calculator`` and a ``python`` interpreter running in an ``rl_llm.sandboxes``
    sandbox. Tasks: arithmetic over retrieved facts (a founder's age at founding, years between events),
    pure arithmetic, digit sums and prime counts (python), plain look-ups. Every task has reference tool calls,
    so the fewest needed calls is known (``info["optimal_tool_calls"]``, used by ``OptimalToolCalls``).

    ## Observation
    On reset, the question; the system prompt declares the tools with their JSON schemas. After tool calls,
    one ``<tool_response name="...">...</tool_response>`` per call, in order; malformed calls get an
    ``Error: ...`` response saying what to fix.

    ## Action
    Tool calls as XML tags (``<search>query</search>``, ``<calculator>expr</calculator>``,
    ``<python>code</python>``) or OpenAI-style JSON (``<tool_call>{"name": "search", "arguments": {"query":
    "..."}}</tool_call>``, or bare ``{"name": ..., "arguments": ...}`` objects), at most
    ``max_calls_per_turn`` per turn; or the final ``<answer>...</answer>``. An answer after tool calls in the
    same turn is ignored (the agent is told to answer after reading the results).

    ## Rewards
    ``answer``: 1 for a correct final answer (numbers compare by value, text by normalised exact match), else 0,
    on the final step. ``info["metrics"]``: ``tool_calls`` (calls run), ``search_calls``, ``calculator_calls``,
    ``python_calls``, ``invalid_tool_calls``, ``correct``, ``answered``, ``turns``.

    ## Episode End
    Terminated by an answer; truncated after ``max_turns`` turns.

    ## Arguments
    - ``tools`` (all three): the tools offered; tasks needing another tool are left out.
    - ``kinds``: task kinds to keep (default all of ``TOOL_TASK_KINDS``); ``kb_seed`` (0).
    - ``retriever`` ("bm25", a server URL or an object), ``top_k`` (3), ``cache_dir``.
    - ``max_turns`` (8), ``max_calls_per_turn`` (4), ``python_timeout`` (5 s), ``sandbox_backend`` ("auto"),
      ``max_output_chars`` (2000 per tool response).

    ## Version History
    - v0: initial release.
    """

    reset_options = frozenset({"task_index"})

    stop = ("</search>", "</calculator>", "</python>", "</tool_call>", "</answer>")

    def __init__(
        self,
        tools: tuple[str, ...] = ("search", "calculator", "python"),
        kinds: tuple[str, ...] | None = None,
        retriever: Retriever | str = "bm25",
        top_k: int = 3,
        max_turns: int = 8,
        max_calls_per_turn: int = 4,
        python_timeout: float = 5.0,
        sandbox_backend: str = "auto",
        kb_seed: int = 0,
        cache_dir: str | os.PathLike[str] | None = None,
        max_output_chars: int = 2000,
        render_mode: str | None = None,
    ) -> None:
        unknown = [tool for tool in tools if tool not in TOOLS]
        if unknown or not tools:
            raise ValueError(f"tools must be a non-empty subset of {sorted(TOOLS)}, got {tools!r}")
        kinds = tuple(kinds or TOOL_TASK_KINDS)
        if bad := [kind for kind in kinds if kind not in TOOL_TASK_KINDS]:
            raise ValueError(f"unknown task kinds {bad}; choose from {TOOL_TASK_KINDS}")
        max_calls_per_turn = checks.integer("max_calls_per_turn", max_calls_per_turn, minimum=1)
        top_k = checks.integer("top_k", top_k, minimum=1)
        max_output_chars = checks.integer("max_output_chars", max_output_chars, minimum=1)
        python_timeout = checks.seconds("python_timeout", python_timeout)
        kb_seed = checks.integer("kb_seed", kb_seed, minimum=0)
        cache_dir = checks.optional_path("cache_dir", cache_dir)
        from rl_llm.sandboxes import BACKENDS  # here: the sandboxes load only with the python tool

        if sandbox_backend not in ("auto", *BACKENDS):  # else the first python call would say so, mid-episode
            raise ValueError(f"sandbox_backend must be one of {['auto', *BACKENDS]}, got {sandbox_backend!r}")
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self.tools, self.top_k = tuple(tools), top_k
        self.max_calls_per_turn, self.max_output_chars = max_calls_per_turn, max_output_chars
        self.tasks: list[ToolTask] = [
            task for task in bundled_kb(kb_seed).tool_tasks if task.kind in kinds and task.tools_needed <= set(tools)
        ]
        if not self.tasks:
            raise ValueError(f"no task can be solved with tools={tools} and kinds={kinds}")
        self.retriever = resolve_retriever(retriever, None, kb_seed, cache_dir) if "search" in tools else None
        self._owns_retriever = self.retriever is not None and made_from_url(self.retriever, retriever)
        self.python = (PythonTool(timeout=python_timeout, backend=sandbox_backend)
                       if "python" in tools else None)  # fmt: skip
        self._markers = {name: (f"<{name}>", f"</{name}>") for name in (*TOOLS, "tool_call", "answer")}
        self._system_prompt = self._describe_tools()

    def _describe_tools(self) -> str:
        schemas = json.dumps([TOOLS[name].schema() for name in self.tools], indent=1)
        examples = {"search": "<search>Ada Lovelace</search>", "calculator": "<calculator>(2023 - 1954) * 2</calculator>",
                    "python": "<python>print(sum(range(10)))</python>"}  # fmt: skip
        return (
            "You answer questions with the help of tools. The tools, as JSON schemas:\n"
            f"{schemas}\n"
            f"Call a tool with its tag, e.g. {', '.join(examples[name] for name in self.tools)}, or with JSON: "
            f'<tool_call>{{"name": "{self.tools[0]}", "arguments": {{"{TOOLS[self.tools[0]].argument}": "..."}}}}'
            f"</tool_call>. You may make up to {self.max_calls_per_turn} calls in one turn; each result comes back "
            'in a <tool_response name="..."> block. Use as few tool calls as you need. When you know the answer, '
            "reply with only <answer>...</answer> holding a number or a name."
        )

    # -- episode -----------------------------------------------------------------------------------------
    def _reset(self, options: dict[str, Any]) -> Task:
        index = self._choose_task_index(options, len(self.tasks))
        self.current_task = self.tasks[index]
        self.counts = {"tool_calls": 0, "invalid_tool_calls": 0, **{f"{name}_calls": 0 for name in TOOLS}}
        if self.python is not None:
            self.python.reset()
        self.initial_observation = self.current_task.question
        info = {"task_index": index, "optimal_tool_calls": self.current_task.optimal_tool_calls,
                "tools": [TOOLS[name].schema() for name in self.tools]}  # fmt: skip
        return Task(self.current_task.question, self.current_task.id, self._system_prompt, info)

    def _step(self, action: str) -> Outcome:
        blocks = scan_blocks(action, self._markers, limit=MAX_BLOCKS_SCANNED)
        if blocks and blocks[0].name == "answer":
            if blocks[0].closed:
                return self._answer(blocks[0].content)
            return self._feedback("Error: the <answer> tag was not closed with </answer>.", invalid=True)
        answer_index = next((i for i, b in enumerate(blocks) if b.name == "answer"), len(blocks))
        if blocks:
            calls = [self._to_call(block) for block in blocks[:answer_index]]
        else:
            calls = parse_json_tool_calls(action, limit=MAX_BLOCKS_SCANNED)
        if not calls:
            return self._feedback("Error: no tool call or answer found. Call a tool, e.g. <search>query</search>, or "
                                  "answer with <answer>...</answer>.", invalid=True)  # fmt: skip
        if len(calls) > self.max_calls_per_turn:
            shown = f"{len(calls)}{'+' if len(calls) >= MAX_BLOCKS_SCANNED else ''}"
            self.counts["invalid_tool_calls"] += len(calls)
            return self._feedback(f"Error: {shown} tool calls in one turn; the limit is {self.max_calls_per_turn}. "
                                  f"None were run: make at most {self.max_calls_per_turn} calls per turn.", invalid=True)  # fmt: skip
        errors = [self._call_error(call) for call in calls]
        responses = [self._run(call, error) for call, error in zip(calls, errors)]
        if answer_index < len(blocks):
            responses.append("Note: the answer in this turn was ignored because the turn also called tools; "
                             "read the results, then answer in a new turn.")  # fmt: skip
        return self._feedback("\n".join(responses), invalid=any(errors))

    def _to_call(self, block: Block) -> ToolCall:
        opening, closing = self._markers[block.name]
        if not block.closed:
            return ToolCall(block.name, error=f"the {opening} tag was not closed with {closing}")
        if block.name == "tool_call":
            parsed = parse_json_tool_calls(f"<tool_call>{block.content}</tool_call>")
            if not parsed:
                return ToolCall("tool_call", error='a <tool_call> must hold {"name": ..., "arguments": {...}}')
            return parsed[0]
        return ToolCall(block.name, {TOOLS[block.name].argument: block.content})

    def _call_error(self, call: ToolCall) -> str | None:
        """Why ``call`` cannot run (malformed, an unknown tool, bad arguments), or None."""
        if call.error is not None:
            return call.error
        if call.name not in self.tools:
            known = "is not available in this environment" if call.name in TOOLS else "does not exist"
            return f"the tool '{call.name}' {known}; the tools are: {', '.join(self.tools)}"
        return validate_arguments(TOOLS[call.name], call.arguments)

    def _run(self, call: ToolCall, error: str | None) -> str:
        if error is not None:
            self.counts["invalid_tool_calls"] += 1
            return _response(call.name or "tool_call", f"Error: {error}.")
        self.counts["tool_calls"] += 1
        self.counts[f"{call.name}_calls"] += 1
        return _response(call.name, truncate_middle(self._execute(call.name, *call.arguments.values()), self.max_output_chars))

    def _execute(self, tool: str, argument: str) -> str:
        if tool == "calculator":
            try:
                return format_number(calculate(argument))
            except CalculatorError as exc:
                return f"Error: {exc}."
        if tool == "python":
            try:
                return self.python.run(argument)  # type: ignore[union-attr]
            except ToolUnavailable as exc:
                return f"Error: the python tool is unavailable: {exc}."
        if not argument.strip() or len(argument) > MAX_QUERY_CHARS:
            return f"Error: the query must be 1 to {MAX_QUERY_CHARS} characters."
        hits, error = retrieve_or_explain(self.retriever, argument, self.top_k)  # type: ignore[arg-type]
        return f"Error: {error}." if error else (format_passages(hits).rstrip() or "No passage matches the query.")

    def _feedback(self, observation: str, invalid: bool) -> Outcome:
        return Outcome(observation, {"answer": 0.0}, invalid_action=invalid, metrics=self._metrics(None))

    def _answer(self, answer: str) -> Outcome:
        correct = numeric_or_exact_match(answer, self.current_task.answers)
        message = f"Episode over: the answer is {'correct' if correct else 'incorrect'}."
        return Outcome(message, {"answer": correct}, terminated=True, metrics=self._metrics(answer, correct), info={"answer": answer})

    def _metrics(self, answer: str | None, correct: float = 0.0) -> dict[str, float]:
        """Running metrics; ``correct`` is the score of ``answer`` (0 while there is none)."""
        return {**{k: float(v) for k, v in self.counts.items()}, "correct": correct, "answered": float(answer is not None),
                "turns": float(self.turn)}  # fmt: skip

    def close(self) -> None:
        if self.python is not None:
            self.python.close()
        if self._owns_retriever:
            self.retriever.close()
        super().close()


def _response(tool: str, content: str) -> str:
    return f'<tool_response name="{tool}">\n{content}\n</tool_response>'
