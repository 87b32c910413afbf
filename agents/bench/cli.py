"""The ``rl-llm bench --agent AGENT [--suite NAME] [--out DIR]`` options and command (``rl_llm/cli.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from rl_llm.console import count_flag, real_flag

if TYPE_CHECKING:
    from rl_llm.agents.bench.suite import Suite


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agent", default=None,
                        help="run one agent over --suite: a baseline name (oracle/random: each env's own), hf:..., "
                             "vllm:MODEL, vllm:http://HOST:PORT#MODEL, vllm-serve:MODEL or openai:URL#MODEL")  # fmt: skip
    parser.add_argument(
        "--suite", default=None, help="suite id (core-v1, smoke-v1; default core-v1) or a YAML path"
    )
    parser.add_argument(
        "--out", default=None, help="run directory (default runs/bench/SUITE-AGENT); rerun to resume"
    )
    parser.add_argument(
        "--concurrency", type=count_flag(1), default=8, help="LLM agents: episodes (requests) in flight"
    )
    parser.add_argument("--max-tokens-budget", type=count_flag(0), default=None,
                        help="stop starting episodes once the run has generated this many tokens")  # fmt: skip
    parser.add_argument("--max-episodes", type=count_flag(0), default=None, help="play at most this many new episodes")
    parser.add_argument("--max-retries", type=count_flag(0), default=None,
                        help="HTTP agents: retries (with exponential backoff) on 429, 5xx, timeouts")  # fmt: skip
    add_sampling_arguments(parser)


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """``--max-new-tokens`` and ``--temperature`` of LLM agents, as ``eval`` and ``bench`` take them: usage
    errors (exit 2) for 0, a negative, NaN or infinity, like every other flag."""
    parser.add_argument("--max-new-tokens", type=count_flag(1), default=None, help="LLM agents: tokens per turn (256)")
    parser.add_argument(
        "--temperature", type=real_flag(minimum=0.0), default=None, help="LLM agents: sampling temperature (1.0)"
    )


def check_baseline(suite: Suite, agent: str) -> None:
    """A baseline name must be one of some env's in the suite: else every env skips it, and a run of nothing
    would exit 0 and claim its --out directory for that name."""
    from rl_llm.agents.baselines import baselines_for

    known = {"oracle", *(name for entry in suite.envs for name in baselines_for(entry.env))}
    if agent not in known:
        raise ValueError(f"unknown agent {agent!r}: no baseline of {suite.id} (its baselines: {', '.join(sorted(known))}) "
                         "and no LLM spec (hf:, vllm:, vllm-serve:, openai:)")  # fmt: skip


def bench_main(args: argparse.Namespace, console: Console) -> int:
    from rl_llm.agents import is_llm_spec
    from rl_llm.agents.bench import load_suite, run_bench

    if not args.agent:
        raise ValueError(
            "--suite needs --agent (without both, bench runs every baseline on every environment)"
        )
    suite = load_suite(args.suite or "core-v1")
    if not is_llm_spec(args.agent):
        check_baseline(suite, args.agent)
    name = args.agent.replace(":", "_").replace("/", "_").replace("#", "_")
    out = Path(args.out or f"runs/bench/{suite.id}-{name}")
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {out} is a file; bench writes a run directory there")
    # A bench run directory holds run.json from its start (run.lock alone: one stopped before it); any other
    # directory with files in it is a person's, where results.md, episodes.jsonl... would overwrite theirs.
    if out.is_dir() and not (out / "run.json").is_file() and {p.name for p in out.iterdir()} - {"run.lock"}:
        raise ValueError(f"--out {out} is a non-empty directory that holds no bench run (no run.json); "
                         "choose a new or empty --out")
    options = {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "max_retries": args.max_retries,
    }
    if not is_llm_spec(args.agent) and any(value is not None for value in options.values()):
        raise ValueError(
            f"--max-new-tokens, --temperature and --max-retries apply to LLM agents, not {args.agent!r}"
        )
    console.print(f"{escape(args.agent)} on {suite.id} -> {out}")
    results = run_bench(
        suite, args.agent, out, concurrency=args.concurrency, max_tokens_budget=args.max_tokens_budget,
        max_episodes=args.max_episodes, policy_options=options, log=lambda line: console.print(escape(line), soft_wrap=True),
    )  # fmt: skip
    console.print(
        (out / "results.md").read_text(encoding="utf-8"), markup=False, highlight=False, soft_wrap=True
    )
    if not results["complete"]:
        reason = results["stopped"] or "some episodes failed (see first_error in results.json)"
        console.print(
            f"[yellow]incomplete: {escape(reason)}[/yellow]; run the same command again to continue"
        )
    console.print(f"results in {out}/results.json, results.md, normalized.png, episodes.jsonl")
    return 0
