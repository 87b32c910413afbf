"""Does the default job (``rl-llm train``, no arguments) learn every time, and how long does it take?

Runs the embedded default job once per training seed (``seed=S``; the held-out evaluation seeds stay the
same) and prints, per seed: the trained policy's mean return and best-arm share on the held-out seeds, the
random and UCB baselines' returns on the same seeds, whether the run passes (return above UCB's and best-arm
share >= 0.9), the wall time and the process CPU time of the run (CPU time is the figure to trust on a
loaded machine: wall time there measures the other processes too), and the machine's load average.

    python benchmarks/default_job.py [--seeds 0,1,2,3,4] [key=value ...]

Extra ``key=value`` arguments override the default job as on the ``rl-llm train`` command line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import tempfile
import time
from pathlib import Path

from rl_llm.trainers.cli import train_main

QUIET = ["log.tensorboard=false", "log.progress=false", "log.plot=false"]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def train_once(config: str | None, seed: int, overrides: list[str], out: Path) -> tuple[float, float]:
    """One quiet ``rl-llm train`` run (``config`` None: the default job) into ``out``: (wall s, CPU s)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # a model-loading bar between the table's rows
    started, cpu = time.perf_counter(), cpu_seconds()
    with contextlib.redirect_stdout(io.StringIO()):
        code = train_main(config, [*QUIET, f"seed={seed}", *overrides], out=str(out))
    wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    if code != 0:
        raise SystemExit(f"seed {seed}: training failed with exit code {code}")
    return wall, cpu


def run_seed(seed: int, overrides: list[str], root: Path) -> dict:
    out = root / f"seed{seed}"
    wall, cpu = train_once(None, seed, overrides, out)
    summary = json.loads((out / "summary.json").read_text())
    after, baselines = summary["after"], summary["baselines"]
    row = {
        "seed": seed,
        "return": after["return"],
        "best_arm_share": after.get("best_arm_share", float("nan")),
        "ucb": baselines.get("ucb", {}).get("return", float("nan")),
        "random": baselines.get("random", {}).get("return", float("nan")),
        "wall_s": wall,
        "cpu_s": cpu,
        "load": os.getloadavg()[0],
    }
    row["learned"] = row["return"] > row["ucb"] and row["best_arm_share"] >= 0.9
    return row


def seed_arguments(description: str, default_seeds: str) -> argparse.Namespace:
    """``--seeds``, ``--keep`` and ``key=value`` overrides: the command line of the per-seed job benchmarks."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seeds", default=default_seeds, help="training seeds, comma-separated")
    parser.add_argument("--keep", help="keep the run directories under this folder (default: a temporary one)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the job's config")
    return parser.parse_args()


def main() -> None:
    args = seed_arguments(__doc__.splitlines()[0], "0,1,2,3,4")
    print(f"{'seed':>4} {'return':>7} {'best-arm':>8} {'ucb':>6} {'random':>6} {'learned':>7} {'wall s':>7} {'cpu s':>7} {'load':>5}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="rl-llm-default-job-") as scratch:
        root = args.keep or scratch
        for seed in (int(s) for s in args.seeds.split(",")):
            row = run_seed(seed, args.overrides, Path(root))
            rows.append(row)
            print(f"{row['seed']:>4} {row['return']:>7.3f} {row['best_arm_share']:>8.3f} {row['ucb']:>6.3f} "
                  f"{row['random']:>6.3f} {row['learned']!s:>7} {row['wall_s']:>7.1f} {row['cpu_s']:>7.1f} "
                  f"{row['load']:>5.1f}", flush=True)  # fmt: skip
    learned = sum(row["learned"] for row in rows)
    print(f"learned {learned}/{len(rows)}; wall time max {max(r['wall_s'] for r in rows):.1f} s, "
          f"CPU time max {max(r['cpu_s'] for r in rows):.1f} s ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
