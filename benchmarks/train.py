"""Wall time per GRPO training step: ours against TRL's GRPOTrainer, and our synchronous loop against the asynchronous one.

Part 1, ours (split into rollout, scoring, update, sync) against TRL's GRPOTrainer.

Both trainers run in this process, one after the other, on the same locally built tiny model, the same
prompts (single-turn MultiArmedBandit episodes: system prompt + first observation through the same chat
template), the same batch shape (``--prompts`` prompts x ``--group`` completions per step, up to
``--new-tokens`` tokens each, one optimizer step on the whole batch, no KL/reference model) and the same
reward (the env's reward for the completion). Ours is the real product path (``train_grpo``: the rollout
engine, the env, collate, the update, the weight sync); its phases come from the run's metrics. TRL's step
is timed from ``on_step_begin`` to ``on_step_end`` (it generates inside the step). The first
``--warmup`` steps of each are dropped; the median of the rest is reported. Target: ours / TRL < 1.

    python benchmarks/train.py [--steps 8] [--prompts 4] [--group 8] [--new-tokens 16]

TRL is an optional dependency (``pip install 'rl-llm[trl]'``); without it only our figures are printed.

Part 2, synchronous against asynchronous (``rollout.max_staleness``), same model, environment, seeds and
episode budget: the default job (``--async-steps`` steps), and a long-tailed case where a third of the
episodes take 6 turns and the rest 1 (``tests/LongTail-v0``, the test suite's synthetic environment: with a
randomly initialised model every real environment gives episodes of near-equal length), where partial
rollouts matter. For each: median wall time per step after warm-up, the generator's idle fraction (sync: the
share of the step spent outside rollout; async: the background generator's measured idle time), and the
final held-out return.

    python benchmarks/train.py --part async [--async-steps 12] [--backend hf|vllm-server]

``--backend hf`` generates in the trainer's process (its own copy of the model, on a thread; on a CPU both
sides share the same cores and the GIL); ``--backend vllm-server`` in a vLLM server process of its own (vLLM's
CPU build here), where generation and the update truly run at the same time.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import gymnasium as gym
import torch

import rl_llm  # noqa: F401
from rl_llm.agents.tiny import tiny_model
from rl_llm.trainers.cli import train_main
from rl_llm.trainers.config import load_config
from rl_llm.trainers.grpo import train_grpo
from rl_llm.trainers.logging import read_metrics

REPO = Path(__file__).resolve().parents[1]

ENV_ID = "rl-llm/MultiArmedBandit-v0"
ENV_KWARGS = {"num_arms": 5, "horizon": 1, "reward_mode": "strategic"}
PHASES = ("rollout", "score", "update", "sync")


def our_step_times(args: argparse.Namespace, run_dir: Path) -> dict[str, list[float]]:
    config = load_config(overrides=[
        f"steps={args.steps}", "algorithm=grpo", f"env.id={ENV_ID}", f"env.kwargs={ENV_KWARGS}",
        f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.new_tokens}", f"optim.micro_batch_size={args.prompts * args.group}",
        "optim.lr=1e-5", "loss.aggregation=token_mean", "loss.clip_high=0.2", "eval.episodes=1",
        "eval.baselines=[]", "log.tensorboard=false", "log.progress=false", "log.plot=false",
        f"log.checkpoint_every={args.steps}",
    ])  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):  # the run's own tables are not the point here
        train_grpo(config, run_dir)
    records = read_metrics(run_dir / "metrics.jsonl")[args.warmup :]
    times = {phase: [r.get(f"time/{phase}_s", 0.0) for r in records] for phase in PHASES}
    times["step"] = [r["time/step_s"] for r in records]
    times["tokens"] = [r["episode/policy_tokens_total"] for r in records]
    return times


def trl_step_times(args: argparse.Namespace, run_dir: Path) -> dict[str, list[float]]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    path = tiny_model()
    tokenizer = AutoTokenizer.from_pretrained(path)
    env = gym.make(ENV_ID, **ENV_KWARGS)
    rows = []
    for seed in range(args.prompts * (args.steps + 1)):
        observation, info = env.reset(seed=seed)
        prompt = [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": observation}]
        rows.append({"prompt": prompt, "seed": seed})

    def env_reward(completions: list, seed: list[int], **_: object) -> list[float]:
        rewards = []
        for completion, episode_seed in zip(completions, seed, strict=True):
            env.reset(seed=episode_seed)
            rewards.append(env.step(completion[0]["content"])[1])
        return rewards

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []

        def on_step_begin(self, *_: object, **__: object) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, *_: object, **__: object) -> None:
            self.seconds.append(time.perf_counter() - self.started)

    batch = args.prompts * args.group
    config = GRPOConfig(
        output_dir=str(run_dir), max_steps=args.steps, per_device_train_batch_size=batch,
        num_generations=args.group, max_completion_length=args.new_tokens, temperature=1.0, learning_rate=1e-5,
        beta=0.0, num_iterations=1, loss_type="dapo", epsilon=0.2, use_cpu=not torch.cuda.is_available(),
        report_to="none", logging_steps=1000, save_strategy="no", seed=0, dataloader_num_workers=0,
        shuffle_dataset=False, disable_tqdm=True,
        # TRL's defaults differ from ours in two ways that would only slow it down here: bf16 autocast (slow
        # on CPUs without bf16 units; both sides run float32) and activation checkpointing (which also
        # turns the KV cache off during generation).
        bf16=False, gradient_checkpointing=False,
    )  # fmt: skip
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(path), reward_funcs=env_reward, args=config,
        train_dataset=Dataset.from_list(rows), processing_class=tokenizer, callbacks=[timer],
    )  # fmt: skip
    trainer.train()
    return {"step": timer.seconds[args.warmup :]}


QUIET = ["log.tensorboard=false", "log.progress=false", "log.plot=false", "eval.baselines=[]"]
LONG_TAIL = ["env.id=tests.trainers.longtail_env:tests/LongTail-v0", "env.kwargs={}", "env.action_template=null", "sft.episodes=0",
             "rollout.max_new_tokens=16", "rollout.group_size=4", "rollout.prompts_per_step=4", "eval.episodes=16"]  # fmt: skip
ASYNC_CASES = {
    "default job": {"sync": [], "async N=1": ["rollout.max_staleness=1"]},
    "long-tailed": {
        "sync": LONG_TAIL,
        "async N=1": [*LONG_TAIL, "rollout.max_staleness=1"],
        "async N=1 + partial": [*LONG_TAIL, "rollout.max_staleness=1", "rollout.partial_rollouts=true"],
    },
}


BACKENDS = {"hf": ["rollout.backend=hf"], "vllm-server": ["rollout.backend=vllm", "rollout.vllm.mode=server"]}


def async_run(overrides: list[str], steps: int, warmup: int, run_dir: Path) -> dict[str, float]:
    """One training run; its median step time, generator idle fraction and final return."""
    with contextlib.redirect_stdout(io.StringIO()):
        assert train_main(None, [f"steps={steps}", *QUIET, *overrides], out=str(run_dir)) == 0
    records = read_metrics(run_dir / "metrics.jsonl")[warmup:]
    if "async/generator_idle_frac" in records[0]:
        idle = statistics.mean(r["async/generator_idle_frac"] for r in records)
    else:  # synchronous: the generator waits while the step scores, updates and syncs
        idle = statistics.mean(1 - r["time/rollout_s"] / r["time/step_s"] for r in records)
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"step": statistics.median(r["time/step_s"] for r in records), "idle": idle,
            "return": summary["return_after"], "wall": summary["wall_time_s"]}  # fmt: skip


def async_comparison(args: argparse.Namespace, scratch: Path) -> None:
    sys.path.insert(0, str(REPO))  # the long-tailed case's environment lives in the test suite
    print(f"\nsync vs async, {args.async_steps} steps each, median step time after {args.warmup} warm-up steps")
    print(f"{'case':14}{'mode':22}{'step s':>9}{'gen idle':>10}{'return':>9}{'wall s':>9}{'speed-up':>10}")
    print(f"generator: {args.backend}")
    for case, modes in ASYNC_CASES.items():
        baseline = None
        for mode, overrides in modes.items():
            figures = async_run([*BACKENDS[args.backend], *overrides], args.async_steps, args.warmup, scratch / f"{case}-{mode}".replace(" ", "_"))
            baseline = baseline or figures["step"]
            print(f"{case:14}{mode:22}{figures['step']:9.3f}{figures['idle']:10.2f}{figures['return']:9.3f}"
                  f"{figures['wall']:9.1f}{baseline / figures['step']:10.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--part", choices=["trl", "async", "all"], default="all")
    parser.add_argument("--async-steps", type=int, default=12)
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="hf", help="the generator of part 2")
    args = parser.parse_args()
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")
    median = statistics.median
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # model loading bars would break the table
    warnings.filterwarnings("ignore", category=FutureWarning)
    with tempfile.TemporaryDirectory() as scratch:
        if args.part in ("async", "all"):
            async_comparison(args, Path(scratch))
        if args.part == "async":
            return
        ours = our_step_times(args, Path(scratch) / "ours")
        print(f"tiny model, {ENV_ID} {ENV_KWARGS}, {args.prompts} prompts x {args.group} completions, "
              f"<= {args.new_tokens} new tokens, median over {args.steps - args.warmup} steps after {args.warmup} warm-up")  # fmt: skip
        print(f"{'':12}{'rollout':>10}{'score':>10}{'update':>10}{'sync':>10}{'step':>10}   (seconds)")
        print(f"{'rl-llm':12}" + "".join(f"{median(ours[k]):10.3f}" for k in (*PHASES, "step")))
        print(f"rl-llm policy tokens per step: {median(ours['tokens']):.0f}")
        try:
            theirs = trl_step_times(args, Path(scratch) / "trl")
        except ImportError as error:
            print(f"TRL not measured: {error} (pip install 'rl-llm[trl]')")
            return
        print(f"{'TRL GRPO':12}{'':40}{median(theirs['step']):10.3f}")
        print(f"ratio rl-llm / TRL step time: {median(ours['step']) / median(theirs['step']):.2f} (target < 1)")


if __name__ == "__main__":
    main()
