"""Cost of the two-player text games of ``rl_llm.envs.social``, measured side by side in one run.

1. Microseconds per game step with PettingZoo's parallel API, and per cycle (both agents acting once) of the
   same game through the AEC API (``parallel_to_aec`` for the simultaneous games); the ratio AEC / parallel is
   the converter's overhead. Actions are fixed valid turns, so only the environment is timed.
2. Linear-time parsing: a game step on a hostile 2 MB action against the same step on a 200 KB one (10x the
   text). A linear parser gives a ratio near 10; a quadratic one would give about 100.

    python benchmarks/social_games.py [--games 200]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from rl_llm.envs.social import load

VALID = {
    "prisoners_dilemma_v0": ("<A>", "<B>"),
    "stag_hunt_v0": ("<A>", "<A>"),
    "chicken_v0": ("<B>", "<A>"),
    "split_v0": ("<propose>hats=10, books=5, balls=0</propose>", "<propose>hats=3, books=3, balls=3</propose>"),
    "trust_and_split_v0": ("<message>hi</message><propose>hats=5, books=5</propose>",) * 2,
}


def action_for(game: str, agent: str) -> str:
    """A valid turn (Trust-and-Split's answers every phase: the game reads the tag of the current phase)."""
    return VALID[game][agent == "player_1"]


def time_parallel(game: str, games: int) -> tuple[float, int]:
    env = load(game).parallel_env()
    steps, start = 0, time.perf_counter()
    for seed in range(games):
        env.reset(seed=seed)
        while env.agents:
            env.step({agent: action_for(game, agent) for agent in env.agents})
            steps += 1
    return (time.perf_counter() - start) / steps, steps


def time_aec(game: str, games: int) -> float:
    """Seconds per cycle: one action from every agent (the steps that remove finished agents are timed but
    are not actions)."""
    env = load(game).env()
    actions, start = 0, time.perf_counter()
    for seed in range(games):
        env.reset(seed=seed)
        for agent in env.agent_iter():
            _, _, terminated, truncated, _ = env.last()
            done = terminated or truncated
            env.step(None if done else action_for(game, agent))
            actions += not done
    return (time.perf_counter() - start) / (actions / 2)


def time_hostile_step(make_text: Callable[[int], str], size: int, repeats: int = 20) -> float:
    env = load("split_v0").parallel_env(num_rounds=1, max_retries=repeats)
    env.reset(seed=0)
    text = make_text(size)
    start = time.perf_counter()
    for _ in range(repeats):
        env.step({"player_0": text, "player_1": text})
    return (time.perf_counter() - start) / repeats


HOSTILE = {
    "unclosed tags": lambda n: "<propose>" * (n // 9),
    "many closed tags": lambda n: "<propose>1</propose>" * (n // 20),
    "one huge proposal": lambda n: "<propose>" + "hats 1 " * (n // 7) + "</propose>",
    "tag soup": lambda n: "</propose><A><message>" * (n // 22),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=200)
    args = parser.parse_args()
    print(f"{'game':<22} {'parallel us/step':>17} {'AEC us/cycle':>13} {'AEC/parallel':>13}")
    for game in VALID:
        per_step, _ = time_parallel(game, args.games)
        per_cycle = time_aec(game, args.games)
        print(f"{game:<22} {per_step * 1e6:>17.1f} {per_cycle * 1e6:>13.1f} {per_cycle / per_step:>13.2f}")
    print(f"\n{'hostile action':<22} {'200 KB ms':>10} {'2 MB ms':>10} {'ratio (linear ~10)':>19}")
    for name, make_text in HOSTILE.items():
        small, large = time_hostile_step(make_text, 200_000), time_hostile_step(make_text, 2_000_000)
        print(f"{name:<22} {small * 1e3:>10.2f} {large * 1e3:>10.2f} {large / small:>19.1f}")


if __name__ == "__main__":
    main()
