"""Tensors follow their inputs' device: the CPU guard for GPU-only bugs (issue #29).

On a GPU a tensor made without ``device=`` lands on the default device (the CPU) and crashes, or silently
slows, as soon as it meets the CUDA inputs. A CPU-only machine can catch the same mistake: keep the inputs on
the CPU and run the code under ``torch.device("meta")`` as the default device. Anything created without an
explicit device then lands on ``meta`` and either raises when it meets a CPU tensor ("Tensor on device meta is
not on the expected device cpu") or comes back as a meta tensor, which the checks below reject. Models and
optimizers are built before the meta default is entered: only the code under test runs inside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from rl_llm.agents.tiny import tiny_model
from rl_llm.trainers import advantages as adv
from rl_llm.trainers import losses
from rl_llm.trainers.batch import TrainBatch, collate, micro_batches, minibatch_indices
from rl_llm.trainers.checkpoint import restore_rng_state, rng_state
from rl_llm.trainers.config import ConfigError, load_config
from rl_llm.trainers.default_job import DEFAULT_JOB
from rl_llm.trainers.modeling import (
    Critic,
    FrozenReference,
    release_cached_memory,
    resolve_device,
    token_logprobs,
    use_device,
)
from rl_llm.trainers.rewards import OTCTransform, pods_select
from rl_llm.trainers.sft import expert_nll, sft
from rl_llm.trainers.update import batched_logprobs, batched_values, critic_update, per_token, policy_update
from tests.trainers.test_batch import one_turn_trajectory, two_turn_trajectory

CPU = torch.device("cpu")


@contextmanager
def meta_default() -> Iterator[None]:
    """Make ``meta`` the default device for the block (restored afterwards, even on failure)."""
    with torch.device("meta"):
        yield
    assert torch.get_default_device() == CPU


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a (nested) result: tuples, lists, dicts, dataclasses."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from tensors_in(getattr(value, field.name))


def assert_on_cpu(value: Any, what: str = "result") -> None:
    found = list(tensors_in(value))
    assert found, f"{what}: no tensor to check"
    for tensor in found:
        assert tensor.device == CPU, f"{what}: a {tuple(tensor.shape)} tensor is on {tensor.device}, not with its inputs"


def test_the_meta_default_catches_a_tensor_made_on_the_default_device() -> None:
    """The guard itself: code that forgets ``device=`` fails under it (with inputs on the CPU)."""
    rewards = torch.tensor([1.0, 0.0, 1.0])

    def forgetful(values: torch.Tensor) -> torch.Tensor:
        return values + torch.zeros(len(values))  # no device=: the default one

    def careful(values: torch.Tensor) -> torch.Tensor:
        return values + torch.zeros(len(values), device=values.device)

    with meta_default():
        with pytest.raises(RuntimeError, match="meta"):
            forgetful(rewards)
        assert_on_cpu(careful(rewards))
        with pytest.raises(AssertionError, match="meta"):
            assert_on_cpu(torch.zeros(2))  # a result left on the default device is reported too


# -- advantages ---------------------------------------------------------------------------------------------
REWARDS = torch.tensor([1.0, 0.0, 0.5, 2.0, -1.0, 3.0])
GROUPS = torch.tensor([0, 0, 0, 1, 1, 2])  # group 2 has one member: the "no baseline" branches run too
POLICY_MASK = torch.tensor([[0, 1, 1, 0, 1], [0, 0, 1, 1, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1], [0, 1, 0, 1, 0],
                            [0, 0, 1, 0, 0]], dtype=torch.bool)  # fmt: skip


@pytest.mark.parametrize("name", adv.OUTCOME_ESTIMATORS)
def test_outcome_estimators_stay_on_the_input_device(name: str) -> None:
    expected = adv.outcome_advantages(name, REWARDS, GROUPS)  # outside the guard: the reference values
    with meta_default():
        through_dispatch = adv.outcome_advantages(name, REWARDS, GROUPS)
        direct = getattr(adv, name)(REWARDS, GROUPS)
    assert_on_cpu([through_dispatch, direct])
    assert torch.equal(through_dispatch, expected) and torch.equal(direct, expected)


def test_group_statistics_stay_on_the_input_device() -> None:
    with meta_default():
        size, mean, std = adv._group_stats(REWARDS, GROUPS)
    assert_on_cpu([size, mean, std])
    assert size.tolist() == [3, 3, 3, 2, 2, 1] and std[-1] == 0


def test_gae_broadcast_and_whitening_stay_on_the_input_device() -> None:
    token_rewards = torch.linspace(-1, 1, POLICY_MASK.numel()).reshape(POLICY_MASK.shape)
    values = torch.linspace(0, 1, POLICY_MASK.numel()).reshape(POLICY_MASK.shape).requires_grad_()
    with meta_default():
        results = {
            "broadcast": adv.broadcast(adv.grpo(REWARDS, GROUPS), POLICY_MASK),
            "gae": adv.gae(token_rewards, values, POLICY_MASK, 0.9, 0.8),
            "decoupled_gae same lambdas": adv.decoupled_gae(token_rewards, values, POLICY_MASK, 0.9, 1.0, 1.0),
            "decoupled_gae": adv.decoupled_gae(token_rewards, values, POLICY_MASK, 0.9, 0.95, 1.0),
            "masked_mean": adv.masked_mean(token_rewards, POLICY_MASK),
            "masked_whiten": adv.masked_whiten(token_rewards, POLICY_MASK),
        }
    for name, result in results.items():
        assert_on_cpu(result, name)
    assert torch.equal(results["gae"][0], adv.gae(token_rewards, values, POLICY_MASK, 0.9, 0.8)[0])


# -- losses -------------------------------------------------------------------------------------------------
def test_losses_stay_on_the_input_device() -> None:
    generator = torch.Generator().manual_seed(0)
    shape = POLICY_MASK.shape
    logprobs, old, ref, generated = (-torch.rand(shape, generator=generator) for _ in range(4))
    token_losses = torch.randn(shape, generator=generator)
    logits = torch.randn((*shape, 7), generator=generator)
    with meta_default():
        results = {
            "clipped_surrogate": losses.clipped_surrogate(logprobs, old, token_losses, 0.2, 0.28),
            "value_loss clipped": losses.value_loss(logprobs, old, ref, 0.2),
            "value_loss": losses.value_loss(logprobs, old, ref, None),
            "k3_kl": losses.k3_kl(logprobs, ref),
            "entropy_from_logits": losses.entropy_from_logits(logits),
            "truncated_importance_weights": losses.truncated_importance_weights(old, generated, 1.5),
        }
        for mode in losses.AGGREGATIONS:
            results[f"aggregate {mode}"] = losses.aggregate(token_losses, POLICY_MASK, mode, constant=8.0)
            results[f"aggregate {mode} with minibatch counts"] = losses.aggregate(
                token_losses, POLICY_MASK, mode, num_sequences=10, num_tokens=30, constant=8.0)  # fmt: skip
    for name, result in results.items():
        assert_on_cpu(result, name)


# -- batches and sampling -----------------------------------------------------------------------------------
def make_batch(rows: int = 6, width: int = 10) -> TrainBatch:
    generator = torch.Generator().manual_seed(0)
    lengths = torch.tensor([10, 7, 9, 5, 10, 8])[:rows]
    attention_mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    policy_mask = attention_mask.bool() & (torch.arange(width)[None, :] >= 3)
    return TrainBatch(
        input_ids=torch.randint(10, 1000, (rows, width), generator=generator) * attention_mask,
        attention_mask=attention_mask,
        policy_mask=policy_mask,
        old_logprobs=-torch.rand((rows, width), generator=generator) * policy_mask,
        token_rewards=torch.zeros((rows, width)),
        scores=REWARDS[:rows].clone(),
        group_ids=GROUPS[:rows].clone(),
        policy_versions=torch.zeros(rows, dtype=torch.long),
    )


def test_batch_selection_and_sampling_stay_on_the_input_device() -> None:
    batch = make_batch()
    with meta_default():
        selected = {
            "select by list": batch.select([4, 1]),
            "select by tensor": batch.select(torch.tensor([0, 3, 5], device=CPU)),
            "select nothing": batch.select([]),
        }
        parts = minibatch_indices(len(batch), 3, torch.Generator().manual_seed(0))
        chunks = micro_batches(parts[0], 1)
        token_sums = per_token(batch, 4, lambda sub: sub.input_ids.float())
    for name, result in selected.items():
        assert_on_cpu(result, name)
    assert selected["select by list"].input_ids.shape == (2, 10)  # trimmed to its longest row
    assert_on_cpu(parts + chunks)
    assert sorted(torch.cat(parts).tolist()) == list(range(len(batch)))
    assert_on_cpu(token_sums)
    assert torch.equal(token_sums, batch.input_ids.float())


def test_minibatch_shuffle_draws_on_its_generators_device() -> None:
    """``torch.randperm(generator=g)`` must be told ``g``'s device: a CUDA default refuses a CPU generator."""
    expected = minibatch_indices(6, 2, torch.Generator().manual_seed(3))
    with meta_default():
        drawn = minibatch_indices(6, 2, torch.Generator().manual_seed(3))
    assert_on_cpu(drawn)
    assert all(torch.equal(a, b) for a, b in zip(drawn, expected, strict=True))


# -- rewards (scoring transforms): plain Python numbers whatever the default device -----------------------------
def test_reward_transforms_return_python_numbers() -> None:
    with meta_default():
        scores = OTCTransform("grpo")([1.0, 1.0, 0.0], [1, 3, 2], ["a", "a", "a"])
        keep = pods_select([0.0, 1.0, 0.5, 0.2], ["a"] * 4, 2)
    assert all(type(score) is float for score in scores) and scores[0] > scores[1]
    assert all(type(index) is int for index in keep) and keep == [0, 1]
    assert not any(isinstance(value, (torch.Tensor, np.ndarray)) for value in [*scores, *keep])


# -- the model side: log-probs, critic, reference, one whole update -----------------------------------------
@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model())


def test_token_logprobs_critic_and_reference_stay_on_the_input_device(tiny: torch.nn.Module) -> None:
    batch = make_batch()
    critic = Critic(tiny)
    reference = FrozenReference(tiny)
    with meta_default():
        results = {
            "all positions": token_logprobs(tiny, batch.input_ids, batch.attention_mask, 0.7, with_entropy=True),
            "policy positions": token_logprobs(tiny, batch.input_ids, batch.attention_mask, 1.0,
                                               entropy_grad=True, positions=batch.policy_mask),
            "critic": critic(batch.input_ids, batch.attention_mask),
            "reference": reference.logprobs(batch.input_ids, batch.attention_mask, 1.0, batch.policy_mask),
            "batched_logprobs": batched_logprobs(tiny, batch, 4, 1.0),
            "batched_values": batched_values(critic, batch, 4),
        }
    for name, result in results.items():
        assert_on_cpu(result, name)
    assert torch.allclose(results["batched_logprobs"], results["policy positions"][0].detach(), atol=1e-5)


def test_one_policy_and_critic_update_stay_on_the_input_device(tiny: torch.nn.Module) -> None:
    """The whole update path (old log-probs, KL reference, TIS, entropy bonus, several minibatches)."""
    config = load_config(overrides=["optim.epochs=2", "optim.minibatches=2", "optim.micro_batch_size=2",
                                    "loss.kl_coef=0.1", "loss.entropy_coef=0.01", "loss.tis_cap=2.0"],
                         base=DEFAULT_JOB)  # fmt: skip
    batch = make_batch()
    model = AutoModelForCausalLM.from_pretrained(tiny_model())
    critic = Critic(model)
    reference = FrozenReference(model)
    # SGD keeps no state: AdamW makes its step counters on the default device by design (CPU scalars)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    critic_optimizer = torch.optim.SGD(critic.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in model.parameters()]
    with meta_default():
        advantages = adv.broadcast(adv.grpo(batch.scores, batch.group_ids), batch.policy_mask)
        values = batched_values(critic, batch, 2)
        _, returns = adv.decoupled_gae(batch.token_rewards + batch.policy_mask, values, batch.policy_mask)
        policy_stats = policy_update(model, optimizer, batch, advantages, config, torch.Generator().manual_seed(0),
                                     reference.logprobs)  # fmt: skip
        critic_stats = critic_update(critic, critic_optimizer, batch, values, returns, config,
                                     torch.Generator().manual_seed(0))  # fmt: skip
    assert_on_cpu([advantages, values, returns, list(model.parameters()), list(critic.parameters())])
    assert {"policy_loss", "kl_ref", "tis_weight_mean", "grad_norm"} <= set(policy_stats)
    assert {"value_loss", "critic_grad_norm"} <= set(critic_stats)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_collate_builds_on_the_cpu_whatever_the_default_device() -> None:
    trajectories = [two_turn_trajectory("a"), one_turn_trajectory("a"), one_turn_trajectory("b")]
    expected = collate(trajectories, pad_token_id=0, scores=[1.0, 0.0, 2.0])
    with meta_default():
        batch = collate(trajectories, pad_token_id=0, scores=[1.0, 0.0, 2.0])
    assert_on_cpu(batch, "collate")
    assert all(torch.equal(getattr(batch, f.name), getattr(expected, f.name)) for f in dataclasses.fields(batch))


def test_sft_and_expert_nll_stay_on_the_input_device(tiny: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    batch = make_batch()
    model = AutoModelForCausalLM.from_pretrained(tiny_model())
    # sft() makes its own AdamW, whose step counters torch puts on the default device by design: SGD here
    monkeypatch.setattr(torch.optim, "AdamW", lambda parameters, lr: torch.optim.SGD(parameters, lr=lr))
    with meta_default():
        before = expert_nll(model, batch, micro_batch_size=4)
        step_losses = sft(model, batch, epochs=2, lr=0.5, batch_size=3, micro_batch_size=2, max_grad_norm=1.0, seed=0)
        after = expert_nll(model, batch, micro_batch_size=4)
    assert_on_cpu(list(model.parameters()), "the fine-tuned model")
    assert len(step_losses) == 4 and after < before


# -- model.device: the device a run asks for, or a clear error ------------------------------------------------
@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine seen as one with a single CUDA device (only the calls resolve_device makes)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "cuda:1"])
def test_cuda_without_cuda_is_an_error_not_a_cpu_run(no_cuda: None, spec: str) -> None:
    with pytest.raises(ConfigError, match=rf"model.device={spec} but CUDA is not available .*model.device=cpu"):
        resolve_device(spec)


def test_auto_and_cpu_resolve_without_cuda(no_cuda: None) -> None:
    assert resolve_device("auto") == CPU and resolve_device("cpu") == CPU


def test_a_gpu_index_this_machine_lacks_is_an_error(one_gpu: None) -> None:
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device("cuda") == torch.device("cuda", 0)  # with its index: equal to its tensors' device
    assert resolve_device("auto") == torch.device("cuda", 0)
    with pytest.raises(ConfigError, match=r"model.device=cuda:1 but this machine has 1 visible CUDA device\(s\)"):
        resolve_device("cuda:1")


@pytest.mark.parametrize(("spec", "message"), [("gpu", "is not a device"), ("cuda:x", "is not a device"),
                                               ("", "is not a device"), ("mps", "is not supported by the trainer")])
def test_an_unknown_device_is_an_error(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_device(spec)


def test_the_cli_reports_a_missing_gpu_in_one_line_and_writes_no_run(
    no_cuda: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rl_llm.cli import main
    from rl_llm.trainers.cli import train_main

    assert main(["train", "model.device=cuda:1", "--out", str(tmp_path / "run")]) == 2
    output = capsys.readouterr()
    errors = [line for line in (output.out + output.err).splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "model.device=cuda:1 but CUDA is not available" in errors[0]
    assert "Traceback" not in output.out + output.err
    assert not (tmp_path / "run").exists()  # refused before anything was written
    assert train_main(None, ["model.device=cuda"], out=str(tmp_path / "run")) == 2  # the trainer's own entry too
    assert "error: model.device=cuda but CUDA is not available" in capsys.readouterr().out


def test_device_helpers_leave_the_cpu_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: Any) -> None:
        raise AssertionError("a CUDA call for a CPU run")

    monkeypatch.setattr(torch.cuda, "set_device", forbidden)
    monkeypatch.setattr(torch.cuda, "empty_cache", forbidden)
    assert use_device(CPU) == CPU
    release_cached_memory(CPU)


def test_device_helpers_act_on_the_trainers_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Any]] = []
    current: list[Any] = [0]

    @contextmanager
    def on_device(device: Any) -> Iterator[None]:
        current.append(device)
        yield
        current.pop()

    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(torch.cuda, "device", on_device)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(("empty_cache", current[-1])))
    second = torch.device("cuda", 1)
    assert use_device(second) == second
    release_cached_memory(second)
    assert calls == [("set_device", second), ("empty_cache", second)]


# -- checkpoints across machines: RNG states ----------------------------------------------------------------
def test_rng_state_from_a_cuda_machine_restores_on_a_cpu_one(no_cuda: None) -> None:
    shuffle = torch.Generator().manual_seed(5)
    state = rng_state(shuffle)
    state["cuda"] = [torch.get_rng_state()] * 2  # stands for what a two-GPU machine saved (CPU byte tensors)
    expected = (torch.rand(3), torch.rand(3, generator=shuffle))
    restore_rng_state(state, shuffle)
    assert torch.equal(torch.rand(3), expected[0]) and torch.equal(torch.rand(3, generator=shuffle), expected[1])


def test_rng_state_from_a_bigger_machine_restores_the_gpus_this_one_has(
    one_gpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    restored: list[tuple[int, torch.device]] = []
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, device: restored.append((device, s.device)))
    state = rng_state()
    state["cuda"] = [torch.get_rng_state(), torch.get_rng_state()]  # saved with two GPUs
    restore_rng_state(state)
    assert restored == [(0, CPU)]  # device 0 only, from a CPU byte tensor
