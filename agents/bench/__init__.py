"""``rl-llm bench --agent AGENT --suite NAME``: one agent over a versioned suite, with normalized scores.

- ``load_suite(name_or_path)`` (``suite.py``): the suite YAML (``agents/suites/*.yaml``).
- ``run_bench(suite, agent, out, ...)`` (``runner.py``): plays what ``out/episodes.jsonl`` lacks, then writes
  ``results.json``, ``results.md`` and ``normalized.png`` (``report.py``).
- ``episodes.py``: jobs, how each kind of episode is played, the resumable episode log.
"""

from __future__ import annotations

from rl_llm.agents.bench.runner import reference_scores, run_bench
from rl_llm.agents.bench.suite import Suite, SuiteEnv, available_suites, load_suite

__all__ = ["Suite", "SuiteEnv", "available_suites", "load_suite", "reference_scores", "run_bench"]
