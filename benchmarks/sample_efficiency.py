"""Do dynamic sampling, GiGPO and a curriculum make the TicTacToe CPU job learn more from the same episodes?

Runs ``configs/tictactoe_grpo_cpu.yaml`` (warm start on minimax episodes, then RL) once per training seed and
arm, and prints per arm the win-rate gain over the warm-started policy on the held-out seeds (paired, after -
before), the share of trained groups with zero signal (all returns equal: zero GRPO advantage), the training
episodes played, and the CPU time, each next to the same-run baseline arm of its comparison:

(a) plain GRPO (the baseline) / GRPO + dynamic sampling / GiGPO, against the config's random opponent.
    Same episode budget: the baseline draws 6 groups of 8 per step; the filtered arm asks for 4 groups and may
    draw up to 2 replacements (``rollout.filter.zero_variance``, ``max_extra_groups=2``), so it never plays
    more episodes per step than the baseline (it trains on fewer groups, all with signal). GiGPO plays exactly
    the baseline's episodes.
(b) a fixed-level run (the baseline) against a curriculum, both on ``opponent: mixed`` and evaluated at
    ``opponent_skill`` 0.5: the fixed arm trains at 0.5 throughout, the curriculum arm starts at 0 (a random
    opponent) and moves through 0.25 to 0.5 by its running win rate (``curriculum.kind=levels``,
    ``success_metric=win``). Same steps and groups, so the same episodes.

    python benchmarks/sample_efficiency.py [--seeds 0,1,2,3,4] [--arms a,b] [--jobs N] [--smoke] [--keep DIR] [key=value ...]

``--summarise LOG`` prints the summaries from the per-run rows of an earlier run's output (all of it, or
what a stopped run had printed), running nothing. ``--jobs N`` runs N runs at once, each in its own process
on one thread (``OMP_NUM_THREADS=1``, as the README's figures were measured); rows print as runs finish, the
summaries once all have.

``--smoke`` shrinks every run (2 RL steps, a 64-episode warm start, 8 held-out seeds) to check the script end to
end; its figures measure nothing. Extra ``key=value`` arguments override every arm's config.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from default_job import train_once

CONFIG = str(Path(__file__).resolve().parent.parent / "configs" / "tictactoe_grpo_cpu.yaml")
MIXED = ["env.kwargs.opponent=mixed", "env.kwargs.opponent_skill=0.5"]
ARMS = {
    "a": {
        "grpo": [],
        "grpo+filter": ["rollout.prompts_per_step=4", "rollout.filter.zero_variance=true",
                        "rollout.filter.max_extra_groups=2"],
        "gigpo": ["algorithm=gigpo"],
    },
    "b": {
        "fixed@0.5": MIXED,
        "curriculum": [*MIXED, "curriculum.kind=levels", "curriculum.option=opponent_skill",
                       "curriculum.levels=[0.0, 0.25, 0.5]", "curriculum.success_metric=win", "curriculum.window=96",
                       "curriculum.promote_at=0.4", "curriculum.demote_at=0.1"],
    },
}  # fmt: skip
SMOKE = ["steps=2", "sft.episodes=64", "sft.epochs=1", "sft.held_out_episodes=8", "eval.episodes=8",
         "eval.baselines=[random]", "curriculum.window=8"]  # fmt: skip


def paired_gain(before: list[float], after: list[float]) -> float:
    return sum(a - b for a, b in zip(after, before, strict=True)) / len(before)


def run_arm(name: str, overrides: list[str], seed: int, root: Path) -> dict:
    out = root / f"{name}-seed{seed}"
    wall, cpu = train_once(CONFIG, seed, overrides, out)
    before = json.loads((out / "eval_before.json").read_text())["values"]
    after = json.loads((out / "eval_after.json").read_text())["values"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    group_size = json.loads((out / "summary.json").read_text())["config"]["rollout"]["group_size"]
    trained = [r["groups/kept"] + r["groups/readmitted"] for r in records]
    zero = sum(r["groups/zero_std_frac"] * n for r, n in zip(records, trained, strict=True))
    row = {
        "arm": name, "seed": seed, "win_before": sum(before["win"]) / len(before["win"]),
        "win_after": sum(after["win"]) / len(after["win"]), "gain": paired_gain(before["win"], after["win"]),
        "zero_signal": zero / sum(trained), "episodes": int(sum(r["groups/drawn"] for r in records) * group_size),
        "dropped": int(sum(r["groups/dropped"] for r in records)), "wall_s": wall, "cpu_s": cpu,
    }  # fmt: skip
    if "curriculum/level" in records[-1]:
        row["final_level"] = records[-1]["curriculum/level"]
    return row


def mean_sd(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1))


def summarise(comparison: str, rows: list[dict]) -> None:
    arms = [arm for arm in ARMS[comparison] if any(r["arm"] == arm for r in rows)]  # a stopped run may lack some
    # Only the seeds every present arm has (a stopped run's last seed may be partial): the arms stay paired.
    common = set.intersection(*({r["seed"] for r in rows if r["arm"] == arm} for arm in arms)) if arms else set()
    rows = [r for r in rows if r["seed"] in common]
    baseline = next(iter(ARMS[comparison]))
    base = [r for r in rows if r["arm"] == baseline]
    if not base:
        print(f"\n({comparison}) no run of the baseline arm {baseline} yet: nothing to compare")
        return
    base_gain, _ = mean_sd([r["gain"] for r in base])
    base_episodes = sum(r["episodes"] for r in base) / len(base)
    base_cpu = sum(r["cpu_s"] for r in base) / len(base)
    print(f"\n({comparison}) {len(base)} seed(s) of the baseline; baseline arm: {baseline}")
    print(f"{'arm':>12} {'win SFT':>7} {'win RL':>6} {'gain mean ± sd':>15} {'gain>0':>6} {'Δgain vs base':>13} "
          f"{'zero-signal':>11} {'episodes (x base)':>17} {'CPU s (x base)':>15}")  # fmt: skip
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        gain, sd = mean_sd([r["gain"] for r in mine])
        episodes = sum(r["episodes"] for r in mine) / len(mine)
        cpu = sum(r["cpu_s"] for r in mine) / len(mine)
        print(f"{arm:>12} {sum(r['win_before'] for r in mine) / len(mine):>7.3f} "
              f"{sum(r['win_after'] for r in mine) / len(mine):>6.3f} {gain:>+8.3f} ± {sd:.3f} "
              f"{sum(r['gain'] > 0 for r in mine):>3}/{len(mine):<2} {gain - base_gain:>+13.3f} "
              f"{sum(r['zero_signal'] for r in mine) / len(mine):>11.3f} {episodes:>9.0f} ({episodes / base_episodes:.2f}) "
              f"{cpu:>7.0f} ({cpu / base_cpu:.2f})")  # fmt: skip


def rows_from_log(path: str) -> dict[str, list[dict]]:
    """The per-run rows a run printed (``main``'s table), by comparison; other lines are skipped."""
    comparison_of = {arm: comparison for comparison, arms in ARMS.items() for arm in arms}
    rows: dict[str, list[dict]] = {comparison: [] for comparison in ARMS}
    names = ["seed", "win_before", "win_after", "gain", "zero_signal", "episodes", "dropped", "level", "wall_s",
             "cpu_s"]  # fmt: skip
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if len(fields) != 12 or fields[0] not in comparison_of:
            continue
        row: dict = {"arm": fields[0]} | {n: float(v) for n, v in zip(names, fields[1:11], strict=True) if v != "-"}
        rows[comparison_of[fields[0]]].append(row)
    return {comparison: found for comparison, found in rows.items() if found}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4", help="training seeds, comma-separated")
    parser.add_argument("--arms", default="a,b", help="comparisons to run: a (filter, GiGPO), b (curriculum)")
    parser.add_argument("--summarise", metavar="LOG", help="summarise the rows of an earlier run's output, run nothing")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, one process and one thread each")
    parser.add_argument("--smoke", action="store_true", help="tiny runs that only check the script works")
    parser.add_argument("--keep", help="keep the run directories under this folder (default: a temporary one)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of every arm's config")
    args = parser.parse_args()
    if args.summarise:
        for comparison, found in rows_from_log(args.summarise).items():
            summarise(comparison, found)
        return
    comparisons = [c for c in args.arms.split(",") if c]
    unknown = set(comparisons) - set(ARMS)
    if unknown:
        raise SystemExit(f"error: --arms: unknown comparison(s) {sorted(unknown)}; choose from {sorted(ARMS)}")
    extra = (SMOKE if args.smoke else []) + args.overrides
    print(f"{'arm':>12} {'seed':>4} {'win SFT':>7} {'win RL':>6} {'gain':>6} {'zero-signal':>11} {'episodes':>8} "
          f"{'dropped':>7} {'level':>5} {'wall s':>7} {'cpu s':>6} {'load':>5}")  # fmt: skip
    rows: dict[str, list[dict]] = {c: [] for c in comparisons}
    runs = [(comparison, arm, [*overrides, *extra], int(seed)) for seed in args.seeds.split(",")
            for comparison in comparisons for arm, overrides in ARMS[comparison].items()]  # fmt: skip
    if args.jobs > 1:
        os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the workers: one thread per run
    with tempfile.TemporaryDirectory(prefix="rl-llm-sample-efficiency-") as scratch:
        root = Path(args.keep or scratch)
        context = multiprocessing.get_context("spawn")  # a fresh interpreter per worker: no forked torch state
        with ProcessPoolExecutor(max_workers=args.jobs, mp_context=context) as pool:
            pending = {pool.submit(run_arm, arm, overrides, seed, root): comparison
                       for comparison, arm, overrides, seed in runs}  # fmt: skip
            for done in as_completed(pending):
                r = done.result()
                rows[pending[done]].append(r)
                level = f"{r['final_level']:.0f}" if "final_level" in r else "-"
                print(f"{r['arm']:>12} {r['seed']:>4} {r['win_before']:>7.3f} {r['win_after']:>6.3f} {r['gain']:>+6.3f} "
                      f"{r['zero_signal']:>11.3f} {r['episodes']:>8} {r['dropped']:>7} {level:>5} "
                      f"{r['wall_s']:>7.1f} {r['cpu_s']:>6.1f} {os.getloadavg()[0]:>5.1f}", flush=True)  # fmt: skip
    for comparison in comparisons:
        summarise(comparison, rows[comparison])
    print(f"({os.cpu_count()} CPUs; zero-signal: share of trained groups whose returns were all equal)")


if __name__ == "__main__":
    main()
