"""The ``rl-llm`` command line: list, play, eval, bench, train."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium as gym
import yaml
from rich.console import Console
from rich.table import Table

import rl_llm
from rl_llm.envs.registration import ENVIRONMENTS, env_ids

console = Console()


def parse_kwargs(pairs: Sequence[str]) -> dict[str, Any]:
    """``["num_arms=10", "distribution=gaussian"]`` -> ``{"num_arms": 10, "distribution": "gaussian"}``."""
    kwargs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: expected KEY=VALUE, got {pair!r}")
        kwargs[key] = yaml.safe_load(value)
    return kwargs


def resolve_env_id(name: str) -> str:
    """Accept ``rl-llm/TicTacToe-v0``, ``TicTacToe-v0`` or ``TicTacToe``."""
    for env_id in env_ids():
        short = env_id.split("/", 1)[1]
        if name in (env_id, short, short.rsplit("-v", 1)[0]):
            return env_id
    raise SystemExit(f"error: unknown environment {name!r}; `rl-llm list` shows the ids")


def cmd_list(args: argparse.Namespace) -> int:
    from rl_llm.agents.baselines import baselines_for

    table = Table(title="rl-llm environments")
    table.add_column("id")
    table.add_column("description")
    table.add_column("baselines")
    for entry in ENVIRONMENTS:
        table.add_row(entry.id, entry.summary, ", ".join(baselines_for(entry.id)))
    console.print(table)
    return 0


def cmd_play(args: argparse.Namespace) -> int:
    env_id = resolve_env_id(args.env)
    env = gym.make(env_id, **parse_kwargs(args.kwarg))
    observation, info = env.reset(seed=args.seed)
    stop = info["stop"]
    tag = stop[0][2:-1] if stop else None
    console.print(f"[bold]{env_id}[/bold]  task {info['task_id']}\n\n{info['system_prompt']}\n", markup=False)
    if tag:
        console.print(f"(Type a full turn, or just the {tag} content; it is wrapped in <{tag}></{tag}> for you.)")
    total = 0.0
    while True:
        console.print(f"\n{observation}", markup=False)
        try:
            action = input("> ")
        except EOFError:
            console.print("\nbye")
            return 0
        if tag and "<" not in action:
            action = f"<{tag}>{action}</{tag}>"
        observation, reward, terminated, truncated, step_info = env.step(action)
        total += reward
        if terminated or truncated:
            console.print(env.unwrapped.transcript.rsplit("\n\n", 1)[-1], markup=False)
            console.print(f"\nEpisode over ({'terminated' if terminated else 'truncated'}). Return: {total:g}")
            console.print(f"Metrics: {step_info['metrics']}", markup=False)
            return 0


def print_summary(title: str, summaries: dict[str, dict[str, tuple[float, float]]]) -> None:
    """One row per agent, one column per figure, each as mean ± 95% half-width."""
    names = list(dict.fromkeys(name for summary in summaries.values() for name in summary))
    table = Table(title=title)
    table.add_column("agent")
    for name in names:
        table.add_column(name, justify="right")
    for agent, summary in summaries.items():
        cells = []
        for name in names:
            mean, half = summary.get(name, (float("nan"), float("nan")))
            cells.append(f"{mean:.3f}" + ("" if half != half else f" ± {half:.3f}"))
        table.add_row(agent, *cells)
    console.print(table)


def make_agent(spec: str, env_id: str, seed: int):
    """A baseline name, or ``backend:MODEL`` for an LLM backend (see rl_llm.agents.make_policy)."""
    from rl_llm.agents import make_policy

    return make_policy(spec, env_id, seed=seed)


def cmd_eval(args: argparse.Namespace) -> int:
    from rl_llm.agents.evaluate import run_episodes, summarize, write_jsonl

    env_id = resolve_env_id(args.env)
    kwargs = parse_kwargs(args.kwarg)
    policy = make_agent(args.agent, env_id, args.seed)
    try:
        records = run_episodes(
            lambda: gym.make(env_id, **kwargs), policy, args.episodes, seed=args.seed, batch_size=args.batch_size
        )
    finally:
        policy.close()
    print_summary(f"{env_id}: {args.episodes} episodes, seeds {args.seed}..{args.seed + args.episodes - 1}",
                  {args.agent: summarize(records)})
    out = Path(args.out or f"runs/eval/{env_id.split('/')[1]}-{args.agent.replace(':', '_').replace('/', '_')}.jsonl")
    write_jsonl(records, out, env_id=env_id, agent=args.agent)
    console.print(f"episodes written to {out}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from rl_llm.agents.baselines import baselines_for, make_baseline
    from rl_llm.agents.evaluate import run_episodes, summarize

    selected = [resolve_env_id(name) for name in args.envs] if args.envs else env_ids()
    for env_id in selected:
        summaries = {}
        make_env = partial(gym.make, env_id)
        for name in baselines_for(env_id):
            records = run_episodes(make_env, make_baseline(name, env_id, seed=args.seed), args.episodes, seed=args.seed)
            summaries[name] = summarize(records)
        if summaries:
            print_summary(f"{env_id}: {args.episodes} episodes per baseline", summaries)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from rl_llm.trainers.cli import train_main

    return train_main(args.config, args.overrides, out=args.out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rl-llm", description=__doc__)
    parser.add_argument("--version", action="version", version=f"rl-llm {rl_llm.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("list", help="list the environments and their baselines").set_defaults(func=cmd_list)

    play = sub.add_parser("play", help="play an environment yourself in the terminal")
    play.add_argument("env")
    play.add_argument("--seed", type=int, default=None)
    play.add_argument("-k", "--kwarg", action="append", default=[], metavar="KEY=VALUE", help="env argument")
    play.set_defaults(func=cmd_play)

    evaluate = sub.add_parser("eval", help="evaluate an agent for N seeded episodes")
    evaluate.add_argument("env")
    evaluate.add_argument("--agent", required=True, help="baseline name (see `rl-llm list`) or backend:MODEL")
    evaluate.add_argument("--episodes", type=int, default=20)
    evaluate.add_argument("--seed", type=int, default=0)
    evaluate.add_argument("--batch-size", type=int, default=16)
    evaluate.add_argument("--out", default=None, help="JSONL path for per-episode records")
    evaluate.add_argument("-k", "--kwarg", action="append", default=[], metavar="KEY=VALUE", help="env argument")
    evaluate.set_defaults(func=cmd_eval)

    bench = sub.add_parser("bench", help="every baseline on every environment")
    bench.add_argument("envs", nargs="*")
    bench.add_argument("--episodes", type=int, default=50)
    bench.add_argument("--seed", type=int, default=0)
    bench.set_defaults(func=cmd_bench)

    train = sub.add_parser("train", help="train an LLM policy (no CONFIG: the embedded default job)")
    train.add_argument("config", nargs="?", default=None, help="YAML config file")
    train.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    train.add_argument("--out", default=None, help="run directory (default runs/<timestamp>)")
    train.set_defaults(func=cmd_train)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as error:  # bad user input: a clear message, not a traceback
        console.print(f"[red]error:[/red] {error}", markup=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
