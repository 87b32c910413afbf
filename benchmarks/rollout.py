"""Rollout-engine throughput against the backend's raw batched generation, same prompts, same run.

The engine plays ``--episodes`` concurrent episodes (default 32) of a multi-turn env (the multi-armed
bandit, ``--turns`` turns each) with the ``hf`` backend (or ``--backend vllm``: vLLM's offline engine, the
one the trainer uses), and its policy tokens per second are measured over the whole run (resets, env steps,
tokenisation and scheduling included). Then the very prompts the engine sent are generated again straight
through the backend, each turn's prompts of all episodes as one batch (``HFPolicy.generate``, or vLLM's own
``LLM.generate`` on the token ids): the best a lock-step loop with free envs could do. The ratio
``engine tokens/s / raw tokens/s`` is the share of generation throughput the engine keeps; target >= 0.9
(env and bookkeeping cost under 10%). Rounds alternate engine and raw runs; the median ratio is reported.
Both are measured per wall-clock second and per CPU second of this process (``time.process_time``, all
threads): on a machine shared with other jobs the wall-clock figures are noisy, while the CPU-time ratio
still shows what the envs and the bookkeeping cost (it cannot show time spent waiting, which wall-clock does;
with ``--backend vllm`` the model runs in vLLM's own processes, so only the wall-clock ratio is meaningful).

``--train``: also run the default job (``rl-llm train``, same seed) with ``rollout.backend=vllm`` and with
``hf`` and print their wall times, step times and final returns (``--train-steps`` shortens both runs).

    python benchmarks/rollout.py [--backend hf|vllm] [--episodes 32] [--turns 4] [--max-new-tokens 32]
                                 [--rounds 3] [--device cpu|cuda] [--model tiny|PATH] [--hidden-size 128 --layers 2]
                                 [--train [--train-steps N]]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

import rl_llm  # noqa: F401  (registers the environments)
from rl_llm.agents.hf import HFPolicy
from rl_llm.agents.llm import GenerationRequest, SamplingParams
from rl_llm.agents.rollout import EpisodeJob, RolloutEngine
from rl_llm.agents.tiny import default_tiny_model_path, tiny_model
from rl_llm.types import Trajectory

ENV_ID = "rl-llm/MultiArmedBandit-v0"


class Clock:
    """Wall-clock and process CPU seconds since creation."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def elapsed(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


def run_engine(policy: Any, episodes: int, turns: int, seed: int) -> tuple[list[Trajectory], tuple[float, float], RolloutEngine]:
    make_env = functools.partial(gym.make, ENV_ID, horizon=turns)
    engine = RolloutEngine(policy, make_env, concurrency=episodes)
    jobs = [EpisodeJob(seed=seed + i) for i in range(episodes)]
    clock = Clock()
    trajectories = engine.run(jobs)
    return trajectories, clock.elapsed(), engine


def raw_vllm_generate(policy: Any, requests: list[GenerationRequest]) -> list[Any]:
    """vLLM's own batched ``LLM.generate`` on the requests' token ids, sampling as the policy does."""
    import vllm

    prompts = [vllm.TokensPrompt(prompt_token_ids=list(request.prompt_ids)) for request in requests]
    params = [policy._params(request) for request in requests]
    return [output.outputs[0] for output in policy.llm.generate(prompts, params, use_tqdm=False)]


def raw_generation(policy: Any, trajectories: list[Trajectory], stop: tuple[str, ...]) -> tuple[int, tuple[float, float]]:
    """Generate again for every prompt the engine sent, one batch per turn index; tokens and (wall, cpu) seconds."""
    tokens, wall, cpu = 0, 0.0, 0.0
    for turn in range(max(len(t.turns) for t in trajectories)):
        requests = [
            GenerationRequest(messages=[], prompt_ids=t.token_ids[: t.turns[turn].token_start], stop=stop)
            for t in trajectories
            if len(t.turns) > turn
        ]
        clock = Clock()
        generate = policy.generate if isinstance(policy, HFPolicy) else functools.partial(raw_vllm_generate, policy)
        completions = policy.generation_thread().submit(generate, requests).result()  # the engine's thread
        elapsed = clock.elapsed()
        wall, cpu = wall + elapsed[0], cpu + elapsed[1]
        tokens += sum(len(c.token_ids or ()) for c in completions)
    return tokens, (wall, cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default="tiny", help="'tiny' (built locally) or a model directory")
    parser.add_argument("--hidden-size", type=int, default=None, help="build a tiny model of this width")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--train", action="store_true", help="also time the default job with vllm against hf")
    parser.add_argument("--train-steps", type=int, default=None, help="steps of those runs (default: the job's)")
    args = parser.parse_args()

    model = args.model
    if model == "tiny":
        if args.hidden_size:
            name = f"tiny-qwen2-h{args.hidden_size}-l{args.layers}"
            model = tiny_model(default_tiny_model_path().with_name(name), hidden_size=args.hidden_size,
                               intermediate_size=3 * args.hidden_size, num_layers=args.layers,
                               num_heads=args.hidden_size // 32, num_kv_heads=max(1, args.hidden_size // 64))  # fmt: skip
        else:
            model = tiny_model()
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)
    if args.backend == "vllm":
        from rl_llm.agents.vllm_backend import VLLMPolicy

        # The trainer's engine: offline, batched; float32 like the hf side; a bounded KV cache on CPU.
        policy = VLLMPolicy(model, sampling=sampling, async_engine=False, seed=0, dtype="float32",
                            max_model_len=2048)  # fmt: skip
        where = "vLLM's offline engine"
    else:
        policy = HFPolicy(model, sampling=sampling, device=args.device, seed=0, max_batch_size=max(64, args.episodes))
        parameters = sum(p.numel() for p in policy.model.parameters())
        where = f"{policy.device} ({parameters / 1e6:.2f}M parameters)"
    print(f"backend {args.backend} | model {model} on {where}")
    print(f"env {ENV_ID}: {args.episodes} concurrent episodes x {args.turns} turns, "
          f"{args.max_new_tokens} new tokens per turn at temperature 1\n")  # fmt: skip
    run_engine(policy, args.episodes, 1, seed=10_000)  # warm-up at full batch size (allocations, kernels)

    stop = tuple(gym.make(ENV_ID).unwrapped.stop)
    wall_ratios, cpu_ratios = [], []
    print(f"{'round':>5} {'engine tok/s':>13} {'raw tok/s':>10} {'ratio':>6} {'CPU-time ratio':>15} {'batches':>8} {'mean batch':>10}")
    for round_index in range(args.rounds):
        trajectories, (engine_wall, engine_cpu), engine = run_engine(policy, args.episodes, args.turns, round_index * 1000)
        errors = [t.error for t in trajectories if t.error]
        if errors:
            raise SystemExit(f"{len(errors)} episodes failed, e.g. {errors[0]}")
        engine_tokens = sum(t.num_policy_tokens for t in trajectories)
        raw_tokens, (raw_wall, raw_cpu) = raw_generation(policy, trajectories, stop)
        wall_ratios.append((engine_tokens / engine_wall) / (raw_tokens / raw_wall))
        cpu_ratios.append((engine_tokens / engine_cpu) / (raw_tokens / raw_cpu))
        batches = engine.stats.batches
        print(f"{round_index:>5} {engine_tokens / engine_wall:>13.0f} {raw_tokens / raw_wall:>10.0f} {wall_ratios[-1]:>6.3f} "
              f"{cpu_ratios[-1]:>15.3f} {len(batches.batch_sizes):>8} {batches.mean_batch_size:>10.1f}")  # fmt: skip
    wall, cpu = statistics.median(wall_ratios), statistics.median(cpu_ratios)
    print(f"\nengine / raw generation throughput over {args.rounds} rounds: median {wall:.3f} per wall-clock second "
          f"({'meets' if wall >= 0.9 else 'misses'} the 0.9 target), {cpu:.3f} per CPU second")  # fmt: skip
    policy.close()
    if args.train:
        compare_training(args.train_steps)


def compare_training(steps: int | None) -> None:
    """The default job with rollout.backend=vllm and hf, one after the other, same seed: wall time and returns."""
    print("\ndefault job (rl-llm train, seed 0), vllm colocated against hf:")
    results = {}
    for backend in ("vllm", "hf"):
        with tempfile.TemporaryDirectory() as run_dir:
            command = [sys.executable, "-m", "rl_llm.cli", "train", "--out", run_dir, f"rollout.backend={backend}",
                       "log.tensorboard=false", "log.progress=false", *([f"steps={steps}"] if steps else [])]  # fmt: skip
            clock = Clock()
            done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            wall = clock.elapsed()[0]
            if done.returncode != 0:
                raise SystemExit(f"rl-llm train with rollout.backend={backend} failed:\n{done.stderr[-3000:]}")
            summary = json.loads((Path(run_dir) / "summary.json").read_text())
            rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
        results[backend] = wall
        step_s = sum(row["time/step_s"] for row in rows)
        rollout_s = sum(row["time/rollout_s"] for row in rows)
        print(f"  {backend:>4}: {wall:6.1f} s wall ({len(rows)} steps: {step_s:.1f} s in steps, {rollout_s:.1f} s "
              f"rollout), return {summary['return_before']:.3f} -> {summary['return_after']:.3f}")  # fmt: skip
    print(f"  wall time vllm / hf: {results['vllm'] / results['hf']:.2f}")


if __name__ == "__main__":
    main()
