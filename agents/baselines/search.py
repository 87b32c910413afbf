"""Oracle agents for the search and tool-call environments, and the scripted-oracle base they share with
the terminal oracle.

An oracle reads the task's reference solution from ``env.unwrapped`` in ``start_episode`` (the searches
that suffice, the tool calls, the gold answer), then makes exactly those calls, one per turn, and answers.
It needs no per-slot state while playing: the conversation's first user message names the episode and the
number of assistant turns so far says which step of the plan comes next.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import gymnasium as gym

from rl_llm.agents.policy import Completion, Policy
from rl_llm.types import Message


class ScriptedOracle(Policy):
    """Plays a per-episode plan of turns built from the env's ground truth.

    Plans are keyed by the episode's first observation (the conversation's first user message), so batches
    that hold only some of the slots still find theirs; equal first observations mean equal tasks and plans.
    Only the plans of the episodes now running are kept.
    """

    def __init__(self, seed: int | None = None) -> None:
        self._slot_keys: dict[int, str] = {}
        self._plans: dict[str, list[str]] = {}

    def plan(self, env: Any) -> list[str]:
        """The turns to play, given the unwrapped env just after reset."""
        raise NotImplementedError

    def first_observation(self, env: Any) -> str:
        return env.initial_observation

    def start_episode(self, slot: int, env: gym.Env, info: dict[str, Any]) -> None:
        base = env.unwrapped
        key = self.first_observation(base)
        self._slot_keys[slot] = key
        self._plans = {k: self._plans[k] for k in self._slot_keys.values() if k in self._plans}  # drop ended ones
        self._plans[key] = self.plan(base)

    def act(self, conversations: Sequence[Sequence[Message]]) -> list[Completion]:
        completions = []
        for conversation in conversations:
            first_user = next((m.content for m in conversation if m.role == "user"), "")
            plan = self._plans.get(first_user)
            if plan is None:
                raise ValueError(f"{self.name}: no plan for this conversation; was start_episode called after reset?")
            step = sum(message.role == "assistant" for message in conversation)
            completions.append(Completion(plan[min(step, len(plan) - 1)]))
        return completions


class SearchOracle(ScriptedOracle):
    """Search-v0: the task's oracle queries, one search per turn, then the gold answer, in the env's protocol."""

    name = "oracle"

    def plan(self, env: Any) -> list[str]:
        task, protocol = env.current_task, env.protocol
        if not task.oracle_queries:
            raise ValueError(f"oracle: task {task.id} has no oracle queries (only the bundled set has them)")
        (s_open, s_close), (a_open, a_close) = protocol.search_tags, protocol.answer_tags
        answer = task.answers[0]
        if protocol.name == "research":
            answer = f"The final answer is \\[ \\boxed{{{answer}}} \\]"
        turns = [f"<think> I need to look up {query}. </think>\n{s_open} {query} {s_close}" for query in task.oracle_queries]
        return [*turns, f"<think> I have the answer. </think>\n{a_open} {answer} {a_close}"]


class ToolCallsOracle(ScriptedOracle):
    """ToolCalls-v0: the task's reference tool calls, one per turn, then the answer. ``json=True`` writes
    OpenAI-style ``<tool_call>`` JSON instead of XML tags."""

    name = "oracle"
    json = False

    def plan(self, env: Any) -> list[str]:
        task = env.current_task
        turns = []
        for call in task.calls:
            if self.json:
                turns.append(f"<tool_call>{json.dumps({'name': call.tool, 'arguments': call.arguments})}</tool_call>")
            else:
                argument = next(iter(call.arguments.values()))
                turns.append(f"<{call.tool}>{argument}</{call.tool}>")
        return [*turns, f"<answer>{task.answers[0]}</answer>"]


class ToolCallsJsonOracle(ToolCallsOracle):
    name = "oracle_json"
    json = True
