"""What Advantage Alignment's credit asks of a policy that does not yet react to its opponent, in the iterated
prisoner's dilemma (docs/multi-agent.md#centred-advantages).

Both seats of each self-play match play A (cooperate) with probability ``--p-cooperate``, independently of
the history (the warm-started policy of configs/ipd_advantage_alignment_cpu.yaml). The matches are scored
with the trainer's own functions (trainers/social.py: per-round returns with the game's preset gamma and
reward scale, the per-round leave-one-out baseline over 8 matches per seed, Advantage Alignment), and for
each beta the script prints, over rounds 2 and later: the mean advantage of a move (the Advantage Alignment
term's bias: RLOO alone has mean 0), and how much more credit cooperating gets than defecting after the
opponent cooperated and after it defected. A positive first and a negative second is the reciprocity
(tit-for-tat) that Advantage Alignment is meant to teach; naive RLOO's difference is the same in both.

    python benchmarks/aa_signal.py [--groups 3000] [--betas 0 0.5 1 2 4] [--p-cooperate 0.5] [--seed 0]
"""

from __future__ import annotations

import argparse

import numpy as np

from rl_llm.trainers.social import GAME_PRESETS, advantage_alignment, discounted_returns, rloo_by_round

PAYOFF = {("A", "A"): (3, 3), ("A", "B"): (0, 5), ("B", "A"): (5, 0), ("B", "B"): (1, 1)}


def credit_rows(beta: float, groups: int, p_cooperate: float, rounds: int, seed: int) -> np.ndarray:
    """Rows (opponent's previous move is A, own move is A, advantage) for every seat and round >= 2."""
    preset = GAME_PRESETS["prisoners_dilemma_v0"]
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(groups):
        moves = np.where(rng.random((8, 2, rounds)) < p_cooperate, "A", "B")  # 8 matches of one seed
        rewards = [[PAYOFF[(m[0, t], m[1, t])] for t in range(rounds)] for m in moves]
        per_seat = []
        for s in (0, 1):
            returns = [discounted_returns([r[t][s] for t in range(rounds)], preset["gamma"], preset["reward_scale"])
                       for r in rewards]  # fmt: skip
            per_seat.append(rloo_by_round([dict(enumerate(g)) for g in returns], ["seed"] * 8))
        for match in range(8):
            for s in (0, 1):
                own = [per_seat[s][match][t] for t in range(rounds)]
                other = [per_seat[1 - s][match][t] for t in range(rounds)]
                credit = advantage_alignment(own, other, beta, preset["gamma_aa"])
                for t in range(1, rounds):
                    rows.append((moves[match, 1 - s, t - 1] == "A", moves[match, s, t] == "A", credit[t]))
    return np.array(rows, dtype=float)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=3000, help="seed groups of 8 self-play matches")
    parser.add_argument("--betas", type=float, nargs="+", default=[0.0, 0.5, 1.0, 2.0, 4.0])
    parser.add_argument("--p-cooperate", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{args.groups} seed groups x 8 self-play matches, {args.rounds} rounds, P(A) = {args.p_cooperate}, "
          f"history-blind; beta 0 is naive RLOO")  # fmt: skip
    print(f"{'beta':>5} {'mean credit':>12} {'A-B after A':>12} {'A-B after B':>12}")
    for beta in args.betas:
        rows = credit_rows(beta, args.groups, args.p_cooperate, args.rounds, args.seed)
        gap = []
        for previous in (1.0, 0.0):
            context = rows[rows[:, 0] == previous]
            gap.append(context[context[:, 1] == 1, 2].mean() - context[context[:, 1] == 0, 2].mean())
        print(f"{beta:>5.1f} {rows[:, 2].mean():>+12.3f} {gap[0]:>+12.3f} {gap[1]:>+12.3f}")


if __name__ == "__main__":
    main()
