"""Oracle agents for the search and tool-call environments, and the scripted-oracle base they share with
the terminal, SQL and math oracles.

An oracle reads the task's reference solution from ``env.unwrapped`` when its episode starts (the searches
that suffice, the tool calls, the gold answer), then makes exactly those calls, one per turn, and answers.
The plan lives in the episode's own agent, so concurrent episodes never mix their plans.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rl_llm.agents.policy import EpisodeAgent, EpisodeStart, Policy
from rl_llm.types import Message


class ScriptedOracle(Policy):
    """Plays a per-episode plan of turns built from the env's ground truth (``plan(env.unwrapped)``)."""

    def __init__(self, seed: int | None = None) -> None:
        pass

    def plan(self, env: Any) -> list[str]:
        """The turns to play, given the unwrapped env just after reset."""
        raise NotImplementedError

    def start_episode(self, episode: EpisodeStart) -> EpisodeAgent:
        return Scripted(self.plan(episode.env.unwrapped))


class Scripted(EpisodeAgent):
    """Plays ``turns`` in order: the one after as many turns as the conversation holds answers (the last one
    again if the episode goes on)."""

    def __init__(self, turns: Sequence[str]) -> None:
        if not turns:
            raise ValueError("a scripted episode needs at least one turn")
        self.turns = list(turns)

    def act(self, conversation: Sequence[Message]) -> str:
        step = sum(message.role == "assistant" for message in conversation)
        return self.turns[min(step, len(self.turns) - 1)]


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
