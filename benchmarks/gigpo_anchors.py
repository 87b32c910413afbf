"""How often do a group's turns share an anchor state, i.e. how much can GiGPO's step-level advantage do?

GiGPO (trainers/turn_credit.py) compares the turns of one episode group that answer the same observation; a
turn whose observation no other turn of its group saw gets no step-level advantage. This plays ``--groups``
groups of the run's ``rollout.group_size`` episodes on its training seeds with the run's saved policy
(``RUN_DIR/model``, the trained weights) at the run's sampling temperature, and prints per turn index: the
share of turns whose anchor is shared, the mean size of the anchor group they fall in, and the share whose
step-level advantage ``A^S`` is not 0 (a shared anchor whose returns differ).

    python benchmarks/gigpo_anchors.py RUN_DIR [RUN_DIR ...] [--groups 12]

A run directory is what ``rl-llm train ... --out RUN_DIR`` wrote (``benchmarks/sample_efficiency.py --keep``
keeps them).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rl_llm.types import Trajectory


def turn_sharing(trajectories: Sequence[Trajectory], group_ids: Sequence[int], gamma: float,
                 anchor: str) -> dict[int, dict[str, float]]:  # fmt: skip
    """Per turn index: ``turns``, the share whose anchor state another turn of its group shares, the mean size
    of those anchor groups, and the share whose GiGPO step-level advantage (trainers/turn_credit.py) is not 0."""
    from rl_llm.trainers.turn_credit import anchors, step_advantages

    scores = [t.total_reward for t in trajectories]
    steps = step_advantages(trajectories, scores, group_ids, gamma, anchor, scale_by_std=False)
    members: dict[tuple[int, str], int] = defaultdict(int)
    for group, trajectory in zip(group_ids, trajectories, strict=True):
        for state in anchors(trajectory, anchor):
            members[group, state] += 1
    by_turn: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for group, trajectory, values in zip(group_ids, trajectories, steps, strict=True):
        for t, (state, value) in enumerate(zip(anchors(trajectory, anchor), values, strict=True)):
            by_turn[t].append((members[group, state], value))
    return {t: {"turns": len(cells), "shared": sum(n > 1 for n, _ in cells) / len(cells),
                "group_size": sum(n for n, _ in cells if n > 1) / max(sum(n > 1 for n, _ in cells), 1),
                "nonzero": sum(abs(v) > 1e-9 for _, v in cells) / len(cells)}
            for t, cells in sorted(by_turn.items())}  # fmt: skip


def anchor_stats(run_dir: Path, groups: int) -> dict[int, dict[str, float]]:
    """``turn_sharing`` of ``groups`` groups played on the run's training seeds with its saved policy."""
    from rl_llm.agents.hf import HFPolicy
    from rl_llm.agents.llm import SamplingParams
    from rl_llm.agents.rollout import collect
    from rl_llm.trainers.config import load_config
    from rl_llm.trainers.runner import env_factory

    config = load_config(run_dir / "config.yaml")
    rollout, advantage = config.rollout, config.advantage
    torch.manual_seed(config.seed)
    policy = HFPolicy(run_dir / "model", sampling=SamplingParams(rollout.max_new_tokens, rollout.temperature),
                      device="cpu", seed=config.seed)  # fmt: skip
    seeds = list(range(config.env.train_seed, config.env.train_seed + groups))
    trajectories = collect(env_factory(config), policy, seeds, rollout.group_size,
                           max_new_tokens=rollout.max_new_tokens)  # fmt: skip
    group_ids = [i // rollout.group_size for i in range(len(trajectories))]
    return turn_sharing(trajectories, group_ids, advantage.gigpo_gamma, advantage.gigpo_anchor)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (rl-llm train --out)")
    parser.add_argument("--groups", type=int, default=12, help="episode groups to play per run")
    args = parser.parse_args()
    print(f"{'run':>28} {'turn':>4} {'turns':>5} {'shared anchor':>13} {'anchor group':>12} {'A^S != 0':>8}")
    for run in args.runs:
        stats = anchor_stats(run, args.groups)
        for t, row in stats.items():
            print(f"{run.name:>28} {t + 1:>4} {row['turns']:>5} {row['shared']:>13.2f} {row['group_size']:>12.1f} "
                  f"{row['nonzero']:>8.2f}")  # fmt: skip
        total = sum(r["turns"] for r in stats.values())
        shared = sum(r["shared"] * r["turns"] for r in stats.values()) / total
        nonzero = sum(r["nonzero"] * r["turns"] for r in stats.values()) / total
        later = [r for t, r in stats.items() if t > 0]
        later_turns = sum(r["turns"] for r in later)
        later_shared = sum(r["shared"] * r["turns"] for r in later) / max(later_turns, 1)
        print(f"{run.name:>28}  all: {total} turns, shared anchor {shared:.2f} (after the first turn "
              f"{later_shared:.2f}), A^S != 0 on {nonzero:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
