"""Does GRPO raise the tic-tac-toe win rate over the warm-started model, and how long does the CPU job take?

Runs ``configs/tictactoe_grpo_cpu.yaml`` once per training seed (``seed=S``; the expert, training and held-out
evaluation seeds stay disjoint and the same) and prints, per seed, the win rate and illegal-move rate on the
100 held-out seeds: untrained, after the SFT warm start (``before``) and after GRPO (``after``), the gain
after - before with its 95% half-width (paired over the held-out seeds), the random and minimax baselines'
win rates on the same seeds, the wall time and the process CPU time of the run, and the load average.

    python benchmarks/tictactoe_job.py [--seeds 0,1,2,3,4] [--keep DIR] [key=value ...]

Extra ``key=value`` arguments override the config as on the ``rl-llm train`` command line.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

from default_job import seed_arguments, train_once

CONFIG = str(Path(__file__).resolve().parent.parent / "configs" / "tictactoe_grpo_cpu.yaml")


def paired_gain(before: list[float], after: list[float]) -> tuple[float, float]:
    """Mean of after - before over the same held-out seeds, and its 95% half-width (normal approximation)."""
    diffs = [a - b for a, b in zip(after, before, strict=True)]
    mean = sum(diffs) / len(diffs)
    var = sum((d - mean) ** 2 for d in diffs) / max(len(diffs) - 1, 1)
    return mean, 1.96 * math.sqrt(var / len(diffs))


def run_seed(seed: int, overrides: list[str], root: Path) -> dict:
    out = root / f"seed{seed}"
    wall, cpu = train_once(CONFIG, seed, overrides, out)
    summary = json.loads((out / "summary.json").read_text())
    warm = json.loads((out / "warm_start.json").read_text())
    before = json.loads((out / "eval_before.json").read_text())["values"]
    after = json.loads((out / "eval_after.json").read_text())["values"]
    gain, half_width = paired_gain(before["win"], after["win"])
    return {
        "seed": seed,
        "untrained": warm["untrained_means"]["win"],
        "sft": summary["before"]["win"],
        "grpo": summary["after"]["win"],
        "illegal_sft": summary["before"]["illegal_moves"],
        "illegal_grpo": summary["after"]["illegal_moves"],
        "gain": gain,
        "gain_ci95": half_width,
        "random": summary["baselines"].get("random", {}).get("win", float("nan")),
        "minimax": summary["baselines"].get("minimax", {}).get("win", float("nan")),
        "wall_s": wall,
        "cpu_s": cpu,
        "load": os.getloadavg()[0],
    }


def main() -> None:
    args = seed_arguments(__doc__.splitlines()[0], "0,1,2,3,4")
    print(f"{'seed':>4} {'untrained':>9} {'SFT':>5} {'GRPO':>5} {'gain ± 95%':>12} {'illegal SFT/GRPO':>16} "
          f"{'random':>6} {'minimax':>7} {'wall s':>7} {'cpu s':>7} {'load':>5}")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory(prefix="rl-llm-ttt-job-") as scratch:
        root = Path(args.keep or scratch)
        for seed in (int(s) for s in args.seeds.split(",")):
            r = run_seed(seed, args.overrides, root)
            rows.append(r)
            print(f"{r['seed']:>4} {r['untrained']:>9.2f} {r['sft']:>5.2f} {r['grpo']:>5.2f} "
                  f"{r['gain']:>+6.2f} ± {r['gain_ci95']:.2f} {r['illegal_sft']:>8.2f}/{r['illegal_grpo']:<7.2f} "
                  f"{r['random']:>6.2f} {r['minimax']:>7.2f} {r['wall_s']:>7.1f} {r['cpu_s']:>7.1f} "
                  f"{r['load']:>5.1f}", flush=True)  # fmt: skip
    raised = sum(r["grpo"] > r["sft"] for r in rows)
    print(f"GRPO raised the win rate on {raised}/{len(rows)} seeds; mean gain "
          f"{sum(r['gain'] for r in rows) / len(rows):+.3f}; wall time max {max(r['wall_s'] for r in rows):.1f} s, "
          f"CPU time max {max(r['cpu_s'] for r in rows):.1f} s ({os.cpu_count()} CPUs)")  # fmt: skip


if __name__ == "__main__":
    main()
