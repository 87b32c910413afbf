"""Naive self-play RL versus Advantage Alignment in the iterated prisoner's dilemma (tiny model, CPU), or
TicTacToe self-play against random and minimax (``--game tictactoe``).

The paper's headline trend at small scale (docs/multi-agent.md): from a policy warm-started only to write a
legal move (no preference between A and B), naive self-play RL (``social.advantage_alignment=false``) drifts
to defection, while Advantage Alignment reaches mutual cooperation and is not exploited by always_defect.
Per training seed and arm it prints, on the held-out seeds, the policy's self-play cooperation rate and
welfare, its return against tit-for-tat, what always_defect gets against it (exploitability) and what it gets
back, before (after the warm start) and after RL; then the wall and CPU time of the run and the load.

    python benchmarks/social_train.py [--seeds 0,1,2,3,4] [--arms naive,aa] [--keep DIR] [key=value ...]
    python benchmarks/social_train.py --game tictactoe [--seeds 0]

Extra ``key=value`` arguments override the config as on the ``rl-llm train`` command line.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from default_job import train_once

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
IPD = str(CONFIGS / "ipd_advantage_alignment_cpu.yaml")
TICTACTOE = str(CONFIGS / "tictactoe_selfplay_cpu.yaml")
ARMS = {"naive": ["social.advantage_alignment=false"], "aa": ["social.advantage_alignment=true"]}
IPD_COLUMNS = {  # printed name -> figure of the held-out evaluation (trainers/social.py, evaluate_game)
    "coop": "cooperation_rate/self_play", "welfare": "welfare/self_play", "vs_tft": "return/tit_for_tat",
    "exploit": "exploitability", "vs_alld": "return/always_defect",
}  # fmt: skip
TTT_COLUMNS = {"vs_random": "return/random", "vs_minimax": "return/minimax", "self_invalid": "invalid_actions/self_play"}


def run(config: str, seed: int, overrides: list[str], out: Path, columns: dict[str, str]) -> dict:
    wall, cpu = train_once(config, seed, overrides, out)
    summary = json.loads((out / "summary.json").read_text())
    row = {"seed": seed, "wall_s": wall, "cpu_s": cpu, "load": os.getloadavg()[0]}
    for name, figure in columns.items():
        row[f"{name}_before"] = summary["before"].get(figure, float("nan"))
        row[f"{name}_after"] = summary["after"].get(figure, float("nan"))
    return row


def line(arm: str, row: dict, columns: dict[str, str]) -> str:
    cells = " ".join(f"{row[f'{n}_before']:>7.2f}>{row[f'{n}_after']:<7.2f}" for n in columns)
    return f"{arm:>6} {row['seed']:>4} {cells} {row['wall_s']:>7.1f} {row['cpu_s']:>7.1f} {row['load']:>5.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--game", choices=["ipd", "tictactoe"], default="ipd")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="training seeds, comma-separated")
    parser.add_argument("--arms", default="naive,aa", help="IPD arms: naive, aa (comma-separated)")
    parser.add_argument("--keep", help="keep the run directories under this folder (default: a temporary one)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the config")
    args = parser.parse_args()
    if args.game == "ipd":
        config, columns, arms = IPD, IPD_COLUMNS, {arm: ARMS[arm] for arm in args.arms.split(",")}
    else:
        config, columns, arms = TICTACTOE, TTT_COLUMNS, {"self": []}
    header = " ".join(f"{n + ' b>a':>15}" for n in columns)
    print(f"{'arm':>6} {'seed':>4} {header} {'wall s':>7} {'cpu s':>7} {'load':>5}")
    rows: dict[str, list[dict]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory(prefix="rl-llm-social-") as scratch:
        root = Path(args.keep or scratch)
        for seed in (int(s) for s in args.seeds.split(",")):
            for arm, overrides in arms.items():
                row = run(config, seed, [*overrides, *args.overrides], root / f"{arm}-seed{seed}", columns)
                rows[arm].append(row)
                print(line(arm, row, columns), flush=True)
    for arm, done in rows.items():
        means = {n: sum(r[f"{n}_after"] for r in done) / len(done) for n in columns}
        print(f"{arm}: mean after over {len(done)} seeds: " + ", ".join(f"{n} {v:.2f}" for n, v in means.items())
              + f"; wall time max {max(r['wall_s'] for r in done):.1f} s ({os.cpu_count()} CPUs)")  # fmt: skip


if __name__ == "__main__":
    main()
