"""The ``rl-llm`` command line: list, play, eval, bench, train, doctor, view, export."""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from rich.markup import escape
from rich.table import Table

import rl_llm
from rl_llm.console import ArgumentParser, count_flag, make_console, real_flag
from rl_llm.envs.registration import ENVIRONMENTS, env_ids
from rl_llm.errors import RLLMError
from rl_llm.paths import load_yaml, yaml_problem

console = make_console()  # messages never hard-wrap in pipes and logs


def parse_kwargs(pairs: Sequence[str], env_id: str | None = None) -> dict[str, Any]:
    """``["num_arms=10", "distribution=gaussian"]`` -> ``{"num_arms": 10, "distribution": "gaussian"}``; with
    ``env_id``, a name that env does not take is a ValueError naming its options (one line, not a traceback)."""
    kwargs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {pair!r}")  # main: one error line, exit status 2
        if key in kwargs:  # the last would win silently (`rl-llm train` refuses a repeated override too)
            raise ValueError(f"-k {key} is given twice; give each key once")
        try:
            kwargs[key] = load_yaml(value)  # a repeated key inside, "{a: 1, a: 2}", is an error too
        except yaml.YAMLError as error:  # e.g. "[1, 2": not a ValueError, so a traceback before
            raise ValueError(f"-k {pair}: {value!r} is no YAML value (a number, text, [list] or {{mapping}}; "
                             f"{yaml_problem(error)}); quote text that holds brackets or colons") from None
    if env_id is not None:
        from rl_llm.envs.registration import check_env_kwargs

        check_env_kwargs(env_id, kwargs)
    return kwargs


def social_game(name: str) -> str | None:
    """The social game module name (``prisoners_dilemma_v0``; ``prisoners_dilemma`` also works), or None."""
    from rl_llm.envs.social import GAMES

    for game in GAMES:
        if name in (game, game.rsplit("_v", 1)[0]):
            return game
    return None


# argparse types of counts such as --episodes (0 or fewer printed a table of NaN and exited 0) and of --seed (a
# negative one failed in numpy as "expected non-negative integer", naming no option): rl_llm/checks.py's words.
positive_int = count_flag(1)
seed_int = count_flag(0)


def out_file(out: str | None, default: str) -> Path:
    """``--out`` of eval, checked before any episode is played: a directory there would fail only the last write."""
    path = Path(out or default)
    if path.is_dir():
        raise IsADirectoryError(f"--out {path} is a directory; name a .jsonl file to write instead")
    return path


def resolve_env_id(name: str) -> str:
    """Accept ``rl-llm/TicTacToe-v0``, ``TicTacToe-v0`` or ``TicTacToe``."""
    for env_id in env_ids():
        short = env_id.split("/", 1)[1]
        if name in (env_id, short, short.rsplit("-v", 1)[0]):
            return env_id
    raise ValueError(f"unknown environment {name!r}; `rl-llm list` shows the ids")


def cmd_list(args: argparse.Namespace) -> int:
    from rl_llm.agents.baselines import baselines_for

    table = Table(title="rl-llm environments")
    table.add_column("id")
    table.add_column("description")
    table.add_column("baselines")
    for entry in ENVIRONMENTS:
        table.add_row(entry.id, entry.summary, ", ".join(baselines_for(entry.id)))
    console.print(table)

    from rl_llm.envs.social import GAMES

    games = Table(title="two-player games (PettingZoo, rl_llm.envs.social)")
    games.add_column("game")
    games.add_column("description")
    games.add_column("baselines")
    for game, summary in GAMES.items():
        games.add_row(game, summary, ", ".join(baselines_for(game)))
    console.print(games)
    return 0


def cmd_play(args: argparse.Namespace) -> int:
    """One episode by the person at the terminal, played through the rollout engine like any agent."""
    from rl_llm.agents.human import Human
    from rl_llm.agents.rollout import collect

    env_id = resolve_env_id(args.env)
    human = Human(console)
    (trajectory,) = collect(env_id, human, [args.seed], env_kwargs=parse_kwargs(args.kwarg, env_id), concurrency=1)
    if human.quit:
        console.print("\nbye")
        return 0
    if trajectory.error is not None:
        raise ValueError(trajectory.error)
    return 0


def print_summary(title: str, summaries: dict[str, dict[str, tuple[float, float]]]) -> None:
    """One row per agent, one column per figure, each as mean ± 95% half-width."""
    from rl_llm.agents.evaluate import summary_table

    console.print(summary_table(title, summaries))


def cmd_tournament(game: str, args: argparse.Namespace) -> int:
    """``rl-llm eval GAME --agents a,b,...``: a round robin with both seat orders over ``--episodes`` seeds."""
    from rl_llm.agents import is_llm_spec, make_policy
    from rl_llm.agents.baselines import baselines_for, make_baseline
    from rl_llm.agents.tournament import print_tournament, run_tournament, write_jsonl

    if args.agents and args.agent:  # --agent was dropped without a word
        raise ValueError("give a game's agents once: --agents a,b,... (or --agent for one of them)")
    names = [name for name in (args.agents or args.agent or "").split(",") if name] or baselines_for(game)
    out = out_file(args.out, f"runs/eval/{game}-tournament.jsonl")
    env_kwargs = parse_kwargs(args.kwarg, f"social/{game}")  # checked before any model loads
    options = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
    llms = {name: make_policy(name, game, seed=args.seed, **options) for name in names if is_llm_spec(name)}
    agents = {name: llms.get(name) or make_baseline(name, game, seed=args.seed) for name in names}
    try:
        result = run_tournament(
            game, agents, seeds=range(args.seed, args.seed + args.episodes), env_kwargs=env_kwargs,
            exploiters=args.exploiters.split(",") if args.exploiters else None,
        )  # fmt: skip
    finally:
        for policy in llms.values():
            policy.close()
    print_tournament(result, console)
    write_jsonl(result, out)
    console.print(f"matches written to {out}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rl_llm.agents import make_policy

    game = social_game(args.env)
    if game is not None:
        return cmd_tournament(game, args)
    if not args.agent:
        raise ValueError("--agent is required for a single-agent environment")
    for flag, value in (("--agents", args.agents), ("--exploiters", args.exploiters)):
        if value is not None:  # ignored without a word before
            raise ValueError(f"{flag} is for two-player games (a round robin); {args.env} takes one --agent")
    from rl_llm.agents.evaluate import evaluate, plot_records, summarize, write_jsonl

    env_id = resolve_env_id(args.env)
    kwargs = parse_kwargs(args.kwarg, env_id)
    policy = make_policy(args.agent, env_id, seed=args.seed, max_new_tokens=args.max_new_tokens,
                         temperature=args.temperature)  # fmt: skip
    name = args.agent.replace(":", "_").replace("/", "_").replace("#", "_")
    out = out_file(args.out, f"runs/eval/{env_id.split('/')[1]}-{name}.jsonl")
    trajectories = out.with_suffix(".trajectories.jsonl")  # every agent's, for `rl-llm view`
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task(f"{args.agent} on {env_id}", total=args.episodes)
            records = evaluate(
                env_id, policy, args.episodes, seed=args.seed, env_kwargs=kwargs, batch_size=args.batch_size,
                on_episode=lambda trajectory: progress.advance(task),
                trajectories_out=trajectories,
            )  # fmt: skip
    finally:
        policy.close()
    title = f"{env_id}: {args.episodes} episodes, seeds {args.seed}..{args.seed + args.episodes - 1}"
    print_summary(title, {args.agent: summarize(records)})
    failed = [record for record in records if record.error]
    if failed:
        console.print(f"[yellow]{len(failed)} episode(s) ended on an error[/yellow], e.g. {escape(failed[0].error)}")
    write_jsonl(records, out, env_id=env_id, agent=args.agent)
    try:
        plot = plot_records(records, out.with_suffix(".png"), title=f"{args.agent} on {env_id}")
    except ImportError:  # matplotlib comes with the llm extra
        console.print(f"episodes written to {out}, trajectories to {trajectories} (no plot: pip install matplotlib)")
    else:
        console.print(f"episodes written to {out}, trajectories to {trajectories}, plot to {plot}")
    if records and len(failed) == len(records):  # nothing was measured: a script must not read it as a result
        console.print(f"[red]error:[/red] every episode ({len(records)}) ended on an error; the table measures nothing")
        return 1
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.agent or args.suite:  # one agent over a versioned suite (rl_llm.agents.bench)
        from rl_llm.agents.bench.cli import bench_main

        return bench_main(args, console)
    from rl_llm.agents.baselines import baselines_for, make_baseline
    from rl_llm.agents.evaluate import evaluate, summarize
    from rl_llm.agents.tournament import print_tournament, run_tournament
    from rl_llm.envs.social import GAMES

    names = args.envs or [*env_ids(), *GAMES]
    for name in names:
        game = social_game(name)
        if game is not None:
            seeds = range(args.seed, args.seed + max(1, args.episodes // 10))
            print_tournament(run_tournament(game, baselines_for(game), seeds=seeds), console)
            continue
        env_id = resolve_env_id(name)
        summaries = {
            baseline: summarize(evaluate(env_id, make_baseline(baseline, env_id, seed=args.seed), args.episodes,
                                         seed=args.seed))
            for baseline in baselines_for(env_id)
        }  # fmt: skip
        if summaries:
            print_summary(f"{env_id}: {args.episodes} episodes per baseline", summaries)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from rl_llm.trainers.cli import train_main

    return train_main(args.config, args.overrides, out=args.out, command_line=True)


def cmd_doctor(args: argparse.Namespace) -> int:
    import json

    from rl_llm.doctor import as_json, report, run_checks

    checks = run_checks(probe_vllm=not args.quick)
    if args.json:
        print(json.dumps(as_json(checks), indent=1))
    else:
        report(checks, console)
    return 1 if any(check.section == "install" and check.ok is False for check in checks) else 0


def cmd_view(args: argparse.Namespace) -> int:
    from rl_llm.view import write_view

    out = write_view(args.path, args.out, episodes=args.episodes, tokenizer=args.tokenizer)
    console.print(f"wrote {out} (one self-contained page: open it in a browser, no server needed)", highlight=False)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from rl_llm.export import export

    done = export(args.path, args.format, args.out, min_return=args.min_return, best_per_group=args.best_per_group)
    for note in done.notes:
        console.print(escape(note), highlight=False)
    left = [f"{count} {what}" for count, what in ((done.errored, "ended on an error"),
            (done.filtered, "filtered out"), (done.skipped_lines, "line(s) not a trajectory")) if count]  # fmt: skip
    console.print(f"exported {len(done.rows)} of {done.read} episodes ({args.format}) to {done.out}"
                  + (f"; {', '.join(left)}" if left else ""), highlight=False)  # fmt: skip
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="rl-llm", description=__doc__)
    parser.add_argument("--version", action="version", version=f"rl-llm {rl_llm.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("list", help="list the environments and their baselines").set_defaults(func=cmd_list)

    play = sub.add_parser("play", help="play an environment yourself in the terminal")
    play.add_argument("env")
    play.add_argument("--seed", type=seed_int, default=None)
    play.add_argument("-k", "--kwarg", action="append", default=[], metavar="KEY=VALUE", help="env argument")
    play.set_defaults(func=cmd_play)

    evaluate = sub.add_parser("eval", help="evaluate an agent for N seeded episodes (a tournament for games)")
    evaluate.add_argument("env", help="environment id, or a two-player game such as prisoners_dilemma_v0")
    evaluate.add_argument("--agents", default=None,
                          help="games: comma-separated agents for the round robin (default: every baseline)")
    evaluate.add_argument("--exploiters", default=None,
                          help="games: comma-separated best-response candidates (default: every baseline)")
    evaluate.add_argument("--agent",
                          help="baseline name (see `rl-llm list`), hf:tiny, hf:PATH, vllm:MODEL, "
                               "vllm:http://HOST:PORT#MODEL, vllm-serve:MODEL or openai:URL#MODEL")  # fmt: skip
    evaluate.add_argument("--episodes", type=positive_int, default=20)
    evaluate.add_argument("--seed", type=seed_int, default=0)
    evaluate.add_argument("--batch-size", type=positive_int, default=16)
    evaluate.add_argument("--out", default=None, help="JSONL path for per-episode records (the plot goes next to it)")
    evaluate.add_argument("-k", "--kwarg", action="append", default=[], metavar="KEY=VALUE", help="env argument")
    from rl_llm.agents.bench.cli import add_bench_arguments, add_sampling_arguments

    add_sampling_arguments(evaluate)
    evaluate.set_defaults(func=cmd_eval)

    bench = sub.add_parser("bench", help="an agent over a versioned suite (--agent), or every baseline on every env")
    bench.add_argument("envs", nargs="*", help="without --agent: environments or games (default: all)")
    bench.add_argument("--episodes", type=positive_int, default=50, help="without --agent: episodes per baseline")
    bench.add_argument("--seed", type=seed_int, default=0, help="without --agent: first seed")
    add_bench_arguments(bench)
    bench.set_defaults(func=cmd_bench)

    train = sub.add_parser("train", help="train an LLM policy (no CONFIG: the embedded default job)")
    train.add_argument("config", nargs="?", default=None, help="YAML config file")
    train.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    train.add_argument("--out", default=None, help="run directory (default runs/<timestamp>)")
    train.set_defaults(func=cmd_train)

    doctor = sub.add_parser("doctor", help="what this machine can run, and how to fix what is missing")
    doctor.add_argument("--json", action="store_true", help="the checks as JSON")
    doctor.add_argument("--quick", action="store_true", help="skip importing vLLM (the slowest check)")
    doctor.set_defaults(func=cmd_doctor)

    view = sub.add_parser("view", help="one self-contained HTML page of a run directory or trajectories JSONL")
    view.add_argument("path", help="run directory (metrics.jsonl, summary.json, ...) or a .jsonl of trajectories")
    view.add_argument("--out", default=None, help="HTML file (default: view.html in the run dir, or PATH.html)")
    view.add_argument("--episodes", type=positive_int, default=24, help="how many episodes to show (spread over the run)")
    view.add_argument("--tokenizer", default=None,
                      help="model directory whose tokenizer decodes the token stream (default: the run's model)")
    view.set_defaults(func=cmd_view)

    export = sub.add_parser("export", help="episodes of a trajectories file or run directory as a dataset "
                            "(Hugging Face datasets, parquet, chat-format SFT JSONL)")  # fmt: skip
    export.add_argument("path", help="run directory, *.trajectories.jsonl, samples.jsonl or a bench episodes.jsonl")
    export.add_argument("--format", required=True, choices=("hf", "parquet", "sft-jsonl"),
                        help="hf: datasets save_to_disk; parquet; sft-jsonl: one {messages: [...]} line per episode")
    export.add_argument("--out", default=None, help="output path (default: next to PATH, e.g. X.sft.jsonl)")
    export.add_argument("--min-return", type=real_flag(), default=None, metavar="R",
                        help="keep only episodes whose total return is >= R (rejection sampling)")
    export.add_argument("--best-per-group", action="store_true",
                        help="keep only the best episode of each GRPO group (group_id)")
    export.set_defaults(func=cmd_export)
    return parser


def dump_stacks_on_sigusr1() -> bool:
    """``kill -USR1 PID`` prints every thread's Python stack to stderr and the process goes on: where a run
    that seems stuck spends its time, without a debugger or py-spy on the machine (benchmarks/gpu_check.py sends
    it to a phase past its time limit before stopping it). False where the platform has no SIGUSR1 or stderr is
    no file (``main`` called in a notebook, or under pytest's capture)."""
    if not hasattr(signal, "SIGUSR1"):
        return False
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both an OSError and a ValueError
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    dump_stacks_on_sigusr1()
    if not (sys.stderr.isatty() and sys.stdout.isatty()):
        # Hugging Face's loading/saving bars redraw with carriage returns: noise in a pipe or a log file
        # (`rl-llm train | tee log` too: the bars would land between the piped lines on the terminal).
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        return args.func(args)
    # A clear message, not a traceback; OSError: a path that cannot be written or read (--out naming a
    # directory or a read-only place, a model directory that is not there).
    except (RLLMError, ValueError, OSError, ImportError) as error:
        console.print(f"[red]error:[/red] {escape(str(error))}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
