"""Mixed precision (``trainers/precision.py``) and CUDA determinism (issue #29), on CPU.

This torch autocasts on the CPU in float16 and bfloat16 and has ``torch.amp.GradScaler("cpu")``, so the
mixed-precision path runs here as on a GPU (only slower): float32 master weights, forward passes under
autocast, float16 loss scaling with skipped steps, the scale saved in checkpoints.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

from rl_llm.agents.hf import HFPolicy
from rl_llm.agents.llm import SamplingParams
from rl_llm.agents.tiny import tiny_model
from rl_llm.trainers.batch import TrainBatch
from rl_llm.trainers.config import LoraConfig, ModelConfig, TrainConfig, load_config
from rl_llm.trainers.default_job import DEFAULT_JOB
from rl_llm.trainers.modeling import (
    Critic,
    FrozenReference,
    load_causal_lm,
    make_deterministic,
    nondeterminism_message,
    token_logprobs,
)
from rl_llm.trainers.precision import Precision
from rl_llm.trainers.update import critic_update, policy_update
from rl_llm.types import Message
from tests.trainers.test_update import make_batch

CPU = torch.device("cpu")
UPDATE = ["optim.epochs=2", "optim.minibatches=2", "optim.micro_batch_size=4", "loss.kl_coef=0.1"]


def load(dtype: str, lora: bool = False) -> nn.Module:
    torch.manual_seed(0)  # the LoRA adapters' initialisation
    return load_causal_lm(tiny_model(), ModelConfig(dtype=dtype, lora=LoraConfig(enabled=lora, r=4, alpha=8)), CPU)


def trainable(model: nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def all_finite(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def train(model: nn.Module, precision: Precision | None, updates: int, lr: float = 1e-3) -> list[dict[str, float]]:
    """``updates`` policy updates (4 optimizer steps each, KL to the initial policy) on the same batch."""
    config = load_config(overrides=UPDATE, base=DEFAULT_JOB)
    batch, advantages = make_batch()
    reference = FrozenReference(model)
    optimizer = torch.optim.AdamW(trainable(model), lr=lr)
    generator = torch.Generator().manual_seed(0)
    return [policy_update(model, optimizer, batch, advantages, config, generator, reference.logprobs, None,
                          precision) for _ in range(updates)]  # fmt: skip


def policy_logprobs(model: nn.Module, batch: TrainBatch, precision: Precision) -> torch.Tensor:
    with torch.no_grad(), precision.autocast():
        logprobs, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, positions=batch.policy_mask)
    return logprobs[batch.policy_mask]


# -- the reason for master weights ------------------------------------------------------------------------------
def test_low_precision_weights_under_adamw_break_and_master_weights_do_not() -> None:
    """What the design avoids: float16 weights turn NaN after one AdamW step (eps=1e-8 is 0 in float16), and
    bfloat16 weights round updates of lr=1e-6 (the default) away; float32 master weights move them all."""
    from transformers import AutoModelForCausalLM

    batch, _ = make_batch()

    def one_step(model: nn.Module, precision: Precision) -> nn.Module:
        with precision.autocast():
            logprobs, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, positions=batch.policy_mask)
        precision.backward(-logprobs[batch.policy_mask].mean())
        assert precision.step(torch.optim.AdamW(model.parameters(), lr=1e-6), list(model.parameters()), 1.0)
        return model

    def moved(model: nn.Module, before: list[torch.Tensor]) -> float:
        changed = sum(int((p.float() != b.float()).sum()) for p, b in zip(model.parameters(), before, strict=True))
        return changed / sum(b.numel() for b in before)

    pure = {dtype: AutoModelForCausalLM.from_pretrained(tiny_model(), dtype=dtype) for dtype in (torch.float16, torch.bfloat16)}
    pure_before = {dtype: [p.detach().clone() for p in m.parameters()] for dtype, m in pure.items()}
    assert not all_finite(one_step(pure[torch.float16], Precision()))
    assert moved(one_step(pure[torch.bfloat16], Precision()), pure_before[torch.bfloat16]) < 0.1
    for dtype in ("float16", "bfloat16"):
        model = load(dtype)
        before = [p.detach().clone() for p in model.parameters()]
        assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights, whatever model.dtype
        one_step(model, Precision(dtype))
        assert all_finite(model) and moved(model, before) > 0.9, dtype


# -- full fine-tuning and LoRA, policy and critic ---------------------------------------------------------------
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_float16_policy_updates_stay_finite_and_close_to_float32(lora: bool) -> None:
    if lora:
        pytest.importorskip("peft", reason="LoRA needs peft (pip install 'rl-llm[trl]')")
    mixed, plain = load("float16", lora), load("float32", lora)
    assert all(p.dtype == torch.float32 for p in trainable(mixed))  # what the optimizer steps: float32
    if lora:  # the frozen base stays in float16
        assert {p.dtype for p in mixed.parameters() if not p.requires_grad} == {torch.float16}
    half, full = Precision("float16", CPU), Precision()
    batch, _ = make_batch()
    start = policy_logprobs(mixed, batch, half)
    assert (start - policy_logprobs(plain, batch, full)).abs().max() < 0.005  # float16 matmuls, same weights
    # The KL anchor computes exactly the policy it was copied from (a float16 copy would not: the KL would start
    # above 0 and pull the policy toward float16 rounding).
    with half.autocast():
        anchor = FrozenReference(mixed).logprobs(batch.input_ids, batch.attention_mask, 1.0, batch.policy_mask)
    assert torch.equal(anchor[batch.policy_mask], start)

    lr = 1e-2 if lora else 1e-3  # the adapters' B matrices start at 0: LoRA needs the larger steps to move
    mixed_stats = train(mixed, half, updates=3, lr=lr)
    plain_stats = train(plain, None, updates=3, lr=lr)
    assert all_finite(mixed)
    for stats in mixed_stats:
        assert all(math.isfinite(value) for value in stats.values()), stats
        assert stats["skipped_steps"] == 0 and stats["grad_scale"] == 2.0**16  # no overflow, default scale
    assert "grad_scale" not in plain_stats[-1]  # float32: no scaler, no such figures
    after = policy_logprobs(mixed, batch, half)
    learned = (after - start).abs().max()
    assert learned > 1.0  # the updates moved the log-probs (by about 2)...
    assert (after - policy_logprobs(plain, batch, full)).abs().max() < 0.05 * learned  # ...as float32's moved
    assert mixed_stats[-1]["policy_loss"] == pytest.approx(plain_stats[-1]["policy_loss"], abs=0.02)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_float16_critic_is_trained_in_float32_and_stays_finite(lora: bool) -> None:
    if lora:
        pytest.importorskip("peft", reason="LoRA needs peft (pip install 'rl-llm[trl]')")
    policy = load("float16", lora)
    critic = Critic(policy.get_base_model() if lora else policy)
    assert {p.dtype for p in critic.parameters()} == {torch.float32}  # even copied from a float16 LoRA base
    precision = Precision("float16", CPU)
    config = load_config(overrides=UPDATE, base=DEFAULT_JOB)
    batch, _ = make_batch()
    returns = batch.policy_mask.float() * torch.linspace(-1, 1, len(batch))[:, None]
    optimizer = torch.optim.AdamW(critic.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    stats = []
    for _ in range(3):
        with precision.autocast():
            values = critic(batch.input_ids, batch.attention_mask).detach()
        assert values.dtype == torch.float32
        stats.append(critic_update(critic, optimizer, batch, values, returns, config, generator, precision))
    assert all(bool(torch.isfinite(p).all()) for p in critic.parameters())
    assert all(math.isfinite(value) for record in stats for value in record.values()), stats
    assert stats[-1]["critic_skipped_steps"] == 0 and stats[-1]["critic_grad_scale"] == 2.0**16
    assert stats[-1]["value_loss"] < stats[0]["value_loss"]  # it regresses onto the returns


# -- loss scaling: overflowed steps are skipped ------------------------------------------------------------------
def test_an_overflowing_loss_scale_skips_steps_and_backs_off() -> None:
    model = load("float16")
    precision = Precision("float16", CPU)
    precision.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**100)  # float16 gradients overflow at once
    config = load_config(overrides=UPDATE[:-1], base=DEFAULT_JOB)
    batch, advantages = make_batch()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda n: 1.0)
    before = [p.detach().clone() for p in model.parameters()]
    stats = policy_update(model, optimizer, batch, advantages, config, torch.Generator().manual_seed(0),
                          scheduler=scheduler, precision=precision)  # fmt: skip
    assert stats["skipped_steps"] == 4 and stats["grad_scale"] == 2.0**96  # halved at each of the 4 steps
    assert "grad_norm" not in stats  # an overflowed step has no meaningful gradient norm
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert not optimizer.state and scheduler.last_epoch == 0  # no AdamW step taken, the schedule did not move

    precision.scaler = torch.amp.GradScaler("cpu")  # a sane scale: the same update now steps
    stats = policy_update(model, optimizer, batch, advantages, config, torch.Generator().manual_seed(0),
                          scheduler=scheduler, precision=precision)  # fmt: skip
    assert stats["skipped_steps"] == 0 and math.isfinite(stats["grad_norm"]) and scheduler.last_epoch == 4
    assert any(not torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True)) and all_finite(model)


def test_float32_precision_is_the_plain_loop() -> None:
    full = Precision("float32", CPU)
    assert full.scaler is None and full.autocast_dtype is None and full.stats(3) == {}
    with full.autocast():
        assert not torch.is_autocast_enabled("cpu")
    with Precision("bfloat16", CPU).autocast():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert Precision("bfloat16", CPU).scaler is None  # float32's range: no loss scaling
    a, b = load("float32"), load("float32")
    stats_a = train(a, None, updates=1)
    stats_b = train(b, full, updates=1)
    assert stats_a == stats_b
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_float16_sft_warm_start_steps_learn_and_stay_finite() -> None:
    from rl_llm.trainers.sft import expert_nll, sft

    model = load("float16")
    precision = Precision("float16", CPU)
    batch, _ = make_batch()
    before = expert_nll(model, batch, precision=precision)
    losses = sft(model, batch, epochs=3, lr=1e-3, batch_size=4, micro_batch_size=2, max_grad_norm=1.0, seed=0,
                 precision=precision)  # fmt: skip
    after = expert_nll(model, batch, precision=precision)
    assert len(losses) == 6 and all(math.isfinite(loss) for loss in losses) and all_finite(model)
    assert after < before - 0.5, (before, after)


# -- generation under the trainer's autocast -------------------------------------------------------------------
def test_the_hf_generator_runs_under_the_autocast_it_is_given() -> None:
    from transformers import AutoTokenizer

    model = load("float16")
    seen: list[torch.dtype] = []
    model.get_output_embeddings().register_forward_hook(lambda module, args, output: seen.append(output.dtype))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model())
    sampling = SamplingParams(max_new_tokens=3, temperature=1.0)
    for autocast_dtype, expected in [(torch.float16, torch.float16), (None, torch.float32)]:
        seen.clear()
        policy = HFPolicy(model, tokenizer, sampling=sampling, seed=0, autocast_dtype=autocast_dtype)
        [completion] = policy.act([[Message("user", "pick an arm")]])
        assert seen and set(seen) == {expected}, autocast_dtype
        assert all(math.isfinite(logprob) for logprob in completion.logprobs)
        policy.close()


# -- runs: what TrainingRun builds, checkpoints and resumes -----------------------------------------------------
QUIET = ["log.tensorboard=false", "log.progress=false", "log.plot=false", "eval.baselines=[]"]
ONE_TURN_PPO = ["algorithm=ppo", "model.device=cpu", "model.dtype=float16", "sft.episodes=0", "eval.episodes=4",
                "rollout.prompts_per_step=2", "rollout.group_size=4", "loss.kl_coef=0.1", "env.kwargs={num_arms: 10, horizon: 1}",
                *QUIET]  # fmt: skip


def test_a_float16_run_builds_mixed_precision_and_resumes_its_loss_scales(tmp_path: Path) -> None:
    from rl_llm.trainers.runner import TrainingRun

    config: TrainConfig = load_config(overrides=["steps=3", *ONE_TURN_PPO])
    run = TrainingRun(config, tmp_path, with_critic=True)
    try:
        assert {p.dtype for p in run.model.parameters()} == {torch.float32}
        assert {p.dtype for p in run.critic.parameters()} == {torch.float32}
        assert {p.dtype for p in run.reference.copy.parameters()} == {torch.float32}  # the policy's numerics
        assert run.generator.autocast_dtype == torch.float16
        assert run.precision.scaler is not None and run.critic_precision.scaler is not run.precision.scaler
        # Scales a run would reach after overflows and growth, distinct for the two optimizers.
        for precision, scale in [(run.precision, 2.0**9), (run.critic_precision, 2.0**5)]:
            precision.backward(torch.ones((), requires_grad=True))  # starts the scaler, as a first update does
            precision.scaler.update(scale)
        run.precision.scaler._growth_tracker.fill_(7)  # 7 good steps since the last change of scale
        run.step = 2
        saved = run.save_checkpoint()
    finally:
        run.close()
    assert (saved / "precision.pt").exists()
    restored = TrainingRun(config, tmp_path, with_critic=True)
    try:
        assert restored.step == 2
        assert restored.precision.scaler.get_scale() == 2.0**9
        assert restored.critic_precision.scaler.get_scale() == 2.0**5
        assert restored.precision.scaler.state_dict() == run.precision.scaler.state_dict()
        assert restored.precision.scaler.state_dict()["_growth_tracker"] == 7
    finally:
        restored.close()


def test_float16_ppo_and_grpo_runs_end_to_end(tmp_path: Path) -> None:
    from rl_llm.trainers.cli import train_main
    from rl_llm.trainers.logging import read_metrics

    assert train_main(None, ["steps=2", *ONE_TURN_PPO], out=str(tmp_path / "ppo")) == 0
    grpo = [override for override in ONE_TURN_PPO if not override.startswith("algorithm=")]
    assert train_main(None, ["steps=2", *grpo], out=str(tmp_path / "grpo")) == 0
    for name, keys in [("ppo", {"loss/critic_grad_scale", "loss/value_loss"}), ("grpo", set())]:
        records = read_metrics(tmp_path / name / "metrics.jsonl")
        assert len(records) == 2
        for record in records:
            assert {"loss/grad_scale", "loss/skipped_steps", "loss/policy_loss", *keys} <= record.keys(), name
            assert all(math.isfinite(v) for v in record.values() if isinstance(v, float)), (name, record)
        # The generator runs on the trainer's module under the same autocast: it recorded the trainer's log-probs.
        assert records[0]["loss/logprob_gap_generator"] < 1e-4, name


# -- model.deterministic: CUDA only ----------------------------------------------------------------------------
@pytest.fixture
def cuda_switches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, object]]:
    """Record the process-wide switches instead of setting them (they would outlive the test)."""
    calls: list[tuple[str, object]] = []
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda mode, warn_only=False: calls.append(
        ("use_deterministic_algorithms", (mode, warn_only))))  # fmt: skip
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", lambda enabled: calls.append(("enable_cudnn_sdp", enabled)))
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    return calls


def test_deterministic_cuda_settings_are_applied_on_cuda_only(cuda_switches: list) -> None:
    assert not make_deterministic(CPU, True)
    assert not cuda_switches and torch.backends.cudnn.benchmark and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert not make_deterministic(torch.device("cuda", 0), False)  # model.deterministic=false
    assert not cuda_switches and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert make_deterministic(torch.device("cuda", 0), True)
    # cuDNN's attention is off: its backward has no deterministic kernel for the strict backward to take
    assert cuda_switches == [("use_deterministic_algorithms", (True, True)), ("enable_cudnn_sdp", False)]
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark


@pytest.fixture
def strict_determinism() -> Iterator[None]:
    """PyTorch's deterministic mode for one test (it is process-wide), as a CUDA run sets it."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def refused_operation() -> None:
    """An op PyTorch refuses in deterministic mode on any device (``put_`` without accumulation)."""
    torch.zeros(4).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))


def test_an_operation_without_a_deterministic_kernel_stops_train_with_one_line(
    strict_determinism: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from rl_llm.trainers import cli

    def run_training(config: TrainConfig, run_dir: Path) -> dict:
        refused_operation()
        raise AssertionError("PyTorch no longer refuses put_ in deterministic mode: pick another op")

    monkeypatch.setattr(cli, "run_training", run_training)
    assert cli.train_main(None, ["steps=1"], out=str(tmp_path)) == 2
    out = capsys.readouterr().out
    assert "error: model.deterministic=true" in out and "put_ does not have a deterministic implementation" in out
    assert "set model.deterministic=false" in out and "Traceback" not in out
    # Any other RuntimeError is not this one's to explain.
    monkeypatch.setattr(cli, "run_training", lambda config, run_dir: torch.zeros(2) @ torch.zeros(3))
    with pytest.raises(RuntimeError, match="inconsistent tensor size"):
        cli.train_main(None, ["steps=1"], out=str(tmp_path))


class RecordsMode(torch.autograd.Function):
    """The identity, whose backward notes PyTorch's deterministic mode as the backward pass runs."""

    seen: ClassVar[list[tuple[bool, bool]]] = []

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        RecordsMode.seen.append((torch.are_deterministic_algorithms_enabled(),
                                 torch.is_deterministic_algorithms_warn_only_enabled()))  # fmt: skip
        return grad


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_backward_runs_a_cuda_runs_deterministic_mode_strict(dtype: str) -> None:
    # warn_only (what make_deterministic sets) keeps SDPA's split-key attention backward: not deterministic.
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    precision, x = Precision(dtype, CPU), torch.ones(3, requires_grad=True)
    try:
        RecordsMode.seen.clear()
        torch.use_deterministic_algorithms(True, warn_only=True)
        precision.backward(RecordsMode.apply(x).sum())
        assert RecordsMode.seen == [(True, False)]  # strict while the backward ran
        assert torch.is_deterministic_algorithms_warn_only_enabled()  # warn_only again after it
        torch.use_deterministic_algorithms(False)  # a run without model.deterministic: left off
        precision.backward(RecordsMode.apply(x).sum())
        assert RecordsMode.seen[1] == (False, False) and not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_nondeterminism_message_reads_pytorchs_refusal_only(strict_determinism: None) -> None:
    with pytest.raises(RuntimeError) as refused:
        refused_operation()
    message = nondeterminism_message(refused.value)
    assert message is not None and "\n" not in message and message.count("put_") == 1
    assert nondeterminism_message(RuntimeError("CUDA out of memory")) is None
    assert nondeterminism_message(ValueError("does not have a deterministic implementation")) is None


def test_cuda_in_use_before_the_cublas_setting_is_said(cuda_switches: list, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """cuBLAS reads CUBLAS_WORKSPACE_CONFIG at its first matmul: set after one, the strict backward refuses."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with caplog.at_level("WARNING", logger="rl_llm.trainers.modeling"):
        make_deterministic(torch.device("cuda", 0), True)
    assert "Set CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment before starting Python" in caplog.text
    caplog.clear()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # the CLI's order: nothing said
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    with caplog.at_level("WARNING", logger="rl_llm.trainers.modeling"):
        make_deterministic(torch.device("cuda", 0), True)
    assert not caplog.text


def test_a_users_cublas_workspace_setting_is_kept(cuda_switches: list, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    make_deterministic(torch.device("cuda", 0), True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


class Started(Exception):
    """Stops a TrainingRun right after it resolved its device."""


@pytest.mark.parametrize(("device", "deterministic", "expected"), [
    ("cuda", "true", True), ("cuda", "false", False), ("cpu", "true", False)])  # fmt: skip
def test_a_run_sets_determinism_before_it_touches_the_gpu(
    cuda_switches: list, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, device: str, deterministic: str,
    expected: bool,
) -> None:
    from rl_llm.trainers import runner

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # this machine seen as one with a GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    seen: list[bool] = []

    def first_gpu_call(resolved: torch.device) -> torch.device:
        seen.append(bool(cuda_switches))  # already set when the process first selects its GPU
        raise Started

    monkeypatch.setattr(runner, "use_device", first_gpu_call)
    config = load_config(overrides=[f"model.device={device}", f"model.deterministic={deterministic}"])
    with pytest.raises(Started):
        runner.TrainingRun(config, tmp_path)
    assert seen == [expected]
    assert (os.environ.get("CUBLAS_WORKSPACE_CONFIG") == ":4096:8") == expected
    assert load_config().model.deterministic  # on by default


class WaitsForGeneration(torch.autograd.Function):
    """The identity, whose backward lets a generation start on another thread and gives it time to run."""

    started: ClassVar[Any] = None
    generated: ClassVar[Any] = None
    finished_during_backward: ClassVar[list[bool]] = []

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        WaitsForGeneration.started.set()
        WaitsForGeneration.finished_during_backward.append(WaitsForGeneration.generated.wait(timeout=3.0))
        return grad


def test_hf_generation_on_another_thread_never_runs_under_the_strict_backward() -> None:
    """The deterministic mode is process-wide: the asynchronous loop's hf generator, sampling while the trainer's
    backward ran strict, would meet the strict mode, where the sampler's CUDA cumsum (no deterministic kernel)
    raises and the episodes are dropped. Generation waits for the strict backward instead."""
    import threading

    from transformers import AutoTokenizer

    model = load("float32")
    modes: list[bool] = []  # warn_only as each forward pass of the generation saw it
    model.register_forward_hook(lambda *_: modes.append(torch.is_deterministic_algorithms_warn_only_enabled()))
    policy = HFPolicy(model, AutoTokenizer.from_pretrained(tiny_model()),
                      sampling=SamplingParams(max_new_tokens=3, temperature=1.0), seed=0)  # fmt: skip
    WaitsForGeneration.started, WaitsForGeneration.generated = threading.Event(), threading.Event()
    WaitsForGeneration.finished_during_backward.clear()

    def generate() -> None:
        WaitsForGeneration.started.wait(timeout=30)
        policy.act([[Message("user", "pick an arm")]])
        WaitsForGeneration.generated.set()

    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    generator = threading.Thread(target=generate)
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)  # as make_deterministic sets it on CUDA
        generator.start()
        Precision("float32", CPU).backward(WaitsForGeneration.apply(torch.ones(3, requires_grad=True)).sum())
        generator.join(timeout=60)
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        policy.close()
    assert WaitsForGeneration.finished_during_backward == [False]  # it waited for the backward to end
    assert WaitsForGeneration.generated.is_set() and modes and all(modes)  # then ran, under warn_only only
