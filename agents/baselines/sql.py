"""Text2SQL reference agents: they read the gold SQL from the environment (upper bounds, and checks that the
environment's grading accepts a correct answer through the real parser and database)."""

from __future__ import annotations

from typing import Any

from rl_llm.agents.baselines.search import ScriptedOracle

PROBE_QUERY = "SELECT name FROM sqlite_master WHERE type = 'table'"


class OracleSQL(ScriptedOracle):
    """Submits the task's gold query as ``<solution>`` in its first turn."""

    name = "oracle"

    def plan(self, env: Any) -> list[str]:
        task = getattr(env, "current_task", None)
        if task is None:
            raise ValueError(f"{self.name} needs a TextToSQL environment after reset, got {type(env).__name__}")
        return [f"<think>The question asks for exactly this query.</think>\n<solution>{task.gold_sql}</solution>"]


class SchemaProbeSQL(OracleSQL):
    """Runs one exploratory query (the table list) in multi-turn mode, then submits the gold query."""

    name = "schema-probe"

    def plan(self, env: Any) -> list[str]:
        submit = super().plan(env)
        if env.mode != "multi":
            return submit
        return [f"<think>First I list the tables.</think>\n<sql>{PROBE_QUERY}</sql>", *submit]
