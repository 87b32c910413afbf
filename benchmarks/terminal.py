"""Terminal-v0 throughput: oracle episodes per second with 1 and N concurrent envs, and where the time goes.

Each concurrent env runs in its own thread with its own warm sandbox (the work happens in sandbox
subprocesses, so threads overlap). The time of every reset and step is split into time inside sandbox calls
(``env.unwrapped.sandbox_seconds``: setup, shell commands, the check, sandbox resets) and the rest, the
env's own Python code (task generation, parsing, formatting). Ratios compare runs made side by side here.

    python benchmarks/terminal.py                    # 40 oracle episodes at 1 and 4 envs
    python benchmarks/terminal.py --sweep-seeds 500  # also: pass rates of all baselines, 500 seeds per family
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from rl_llm.agents.baselines.terminal import DoNothing, RandomCommands, TerminalOracle
from rl_llm.agents.policy import EpisodeStart, Policy, as_completion
from rl_llm.envs.terminal import FAMILIES
from rl_llm.envs.terminal.terminal_env import TerminalEnv
from rl_llm.types import Message

AGENTS = {"oracle": TerminalOracle, "do_nothing": DoNothing, "random": RandomCommands}


@dataclass
class Tally:
    episodes: int = 0
    passed: float = 0.0
    env_s: float = 0.0  # inside env.reset / env.step
    sandbox_s: float = 0.0  # of which inside sandbox calls
    turns: int = 0
    task_ids: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        self.episodes += other.episodes
        self.passed += other.passed
        self.env_s += other.env_s
        self.sandbox_s += other.sandbox_s
        self.turns += other.turns
        self.task_ids += other.task_ids


def play(env: TerminalEnv, policy: Policy, seed: int, tally: Tally) -> None:
    started = time.perf_counter()
    observation, info = env.reset(seed=seed)
    tally.env_s += time.perf_counter() - started
    agent = policy.start_episode(EpisodeStart(env, info, seed=seed))
    messages = [Message("system", info["system_prompt"]), Message("user", observation)]
    done = False
    while not done:
        action = as_completion(agent.act(messages)).text
        started = time.perf_counter()
        observation, reward, terminated, truncated, info = env.step(action)
        tally.env_s += time.perf_counter() - started
        messages += [Message("assistant", action), Message("user", observation)]
        tally.passed += reward
        tally.turns += 1
        done = terminated or truncated
    tally.sandbox_s += env.unwrapped.sandbox_seconds
    tally.episodes += 1
    tally.task_ids.append(info.get("task_id", ""))


def run(agent: str, seeds: list[int], workers: int, family: str | None = None) -> tuple[Tally, float]:
    """Play ``seeds`` split over ``workers`` envs; (tally, wall seconds)."""

    def work(part: list[int]) -> Tally:
        tally = Tally()
        env = TerminalEnv(task_family=family)
        try:
            for seed in part:
                play(env, AGENTS[agent](seed=seed), seed, tally)
        finally:
            env.close()
        return tally

    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        parts = list(pool.map(work, [seeds[i::workers] for i in range(workers)]))
    wall = time.perf_counter() - started
    total = Tally()
    for part in parts:
        total.add(part)
    return total, wall


def throughput(episodes: int, concurrency: list[int]) -> None:
    run("oracle", [10_000 + i for i in range(min(4, episodes))], 1)  # warm up: imports, page cache
    print(f"oracle agent, {episodes} episodes (all families, mixed difficulty)")
    print(f"{'envs':>4} {'episodes/s':>10} {'vs 1 env':>8} {'pass':>6} {'sandbox':>8} {'env code':>9} {'agent+idle':>10}")
    base = None
    for workers in concurrency:
        tally, wall = run("oracle", list(range(episodes)), workers)
        rate = tally.episodes / wall
        base = base or rate
        # Per env: its own wall time is `wall`; shares are of the summed wall time of all envs.
        env_wall = wall * workers
        code = tally.env_s - tally.sandbox_s
        print(f"{workers:>4} {rate:>10.2f} {rate / base:>7.2f}x {tally.passed / tally.episodes:>6.0%} "
              f"{tally.sandbox_s / env_wall:>8.1%} {code / env_wall:>9.1%} {1 - tally.env_s / env_wall:>10.1%}")


def sweep(seeds: int, workers: int) -> None:
    print(f"\npass rate over {seeds} seeds per family ({workers} envs in parallel)")
    print(f"{'family':<12}" + "".join(f"{name:>12}" for name in AGENTS) + f"{'seconds':>9}")
    totals = dict.fromkeys(AGENTS, 0.0)
    for family in FAMILIES:
        started = time.perf_counter()
        rates = {}
        for agent in AGENTS:
            tally, _ = run(agent, list(range(seeds)), workers, family)
            rates[agent] = tally.passed / tally.episodes
            totals[agent] += tally.passed
        print(f"{family:<12}" + "".join(f"{rates[a]:>12.1%}" for a in AGENTS) + f"{time.perf_counter() - started:>9.0f}",
              flush=True)
    count = seeds * len(FAMILIES)
    print(f"{'all':<12}" + "".join(f"{totals[a] / count:>12.2%}" for a in AGENTS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--concurrency", default="1,4", help="comma-separated numbers of concurrent envs")
    parser.add_argument("--sweep-seeds", type=int, default=0, help="seeds per family for the pass-rate sweep")
    parser.add_argument("--sweep-workers", type=int, default=4)
    args = parser.parse_args()
    throughput(args.episodes, [int(n) for n in args.concurrency.split(",")])
    if args.sweep_seeds:
        sweep(args.sweep_seeds, args.sweep_workers)


if __name__ == "__main__":
    main()
