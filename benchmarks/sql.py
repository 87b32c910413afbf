"""Reward evaluations per second for TextToSQL on the bundled Chinook set, with and without gold-result caching.

One evaluation executes a predicted query on the read-only database and compares its rows with the gold
rows. Without the cache the gold query runs every time too; with it, once per task (the steady state of RL
training, which revisits the same tasks every epoch; the cache is warmed before timing). The prediction is
the gold query itself, so both sides do the same SQL work. Measured for the execution reward alone and for
the Reasoning-SQL preset (adds sqlglot parsing for syntax, schema linking and n-grams), and for whole
episodes through ``gym.make`` (reset, including the schema text, plus one ``<solution>`` step).

    python benchmarks/sql.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym

import rl_llm  # noqa: F401
from rl_llm.envs.sql.database import QueryLimits
from rl_llm.envs.sql.rewards import resolve_weights
from rl_llm.envs.sql.scoring import GoldCache, SqlScorer
from rl_llm.envs.sql.tasks import load_chinook_tasks


def scorer_rate(cache_gold: bool, preset: str, rounds: int) -> float:
    """Evaluations per second of ``SqlScorer.score`` over every bundled task, ``rounds`` times."""
    tasks = load_chinook_tasks()
    scorer = SqlScorer(limits=QueryLimits(), gold_limits=QueryLimits(30.0), cache_gold=cache_gold,
                       cache=GoldCache())  # fmt: skip
    terms = resolve_weights(preset)
    for task in tasks:  # warm-up: connections, schema columns, the cache when enabled
        scorer.score(task, task.gold_sql, terms)
    start = time.perf_counter()
    for _ in range(rounds):
        for task in tasks:
            assert scorer.score(task, task.gold_sql, terms).values["execution"] == 1.0
    elapsed = time.perf_counter() - start
    scorer.close()
    return rounds * len(tasks) / elapsed


def episode_rate(cache_gold: bool, rounds: int) -> float:
    """Oracle episodes per second through the registered environment."""
    env = gym.make("rl-llm/TextToSQL-v0", cache_gold_results=cache_gold).unwrapped
    env.scorer.cache = GoldCache()
    count = len(env.tasks)
    for index in range(count):
        env.reset(options={"task_index": index})
        env.step(f"<solution>{env.current_task.gold_sql}</solution>")
    start = time.perf_counter()
    for _ in range(rounds):
        for index in range(count):
            env.reset(options={"task_index": index})
            env.step(f"<solution>{env.current_task.gold_sql}</solution>")
    elapsed = time.perf_counter() - start
    env.close()
    return rounds * count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="passes over the bundled tasks per measurement")
    args = parser.parse_args()
    print(f"TextToSQL reward evaluations per second, {len(load_chinook_tasks())} bundled Chinook tasks, "
          f"{args.rounds} rounds")  # fmt: skip
    print(f"{'measurement':<34}{'no cache /s':>12}{'cached /s':>12}{'ratio':>8}")
    rows = [
        ("execution reward", lambda cache: scorer_rate(cache, "execution", args.rounds)),
        ("reasoning_sql preset (5 terms)", lambda cache: scorer_rate(cache, "reasoning_sql", args.rounds)),
        ("episode (reset + solution step)", lambda cache: episode_rate(cache, args.rounds)),
    ]
    for label, measure in rows:
        uncached, cached = measure(False), measure(True)
        print(f"{label:<34}{uncached:>12.0f}{cached:>12.0f}{cached / uncached:>7.2f}x")


if __name__ == "__main__":
    main()
