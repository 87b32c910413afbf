"""Server-mode weight sync against a real vLLM server (CPU build here: a gloo group; NCCL on GPUs, same code).

The session's server (``vllm_server`` in tests/conftest.py) carries the ``WeightReceiver`` worker extension.
After a push, the server's log-probs of a fixed sequence must be the trainer model's (fp32, 1e-4) and differ
from before; the original weights are pushed back at the end, so other tests see the model they expect.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from rl_llm.trainers.server_sync import ServerWeightSync, WeightSyncError

TOLERANCE = 1e-4  # fp32 on both sides
SEQUENCE = [(37 * i + 11) % 1900 + 100 for i in range(40)]  # fixed token ids inside the tiny vocabulary


class Generator:
    """The part of a policy a weight sync drives: its version counter."""

    policy_version = 0

    def mark_updated(self, version: int | None = None) -> None:
        self.policy_version = self.policy_version + 1 if version is None else version


def server_logprobs(server: Any) -> torch.Tensor:
    """The server's log-prob of each token of ``SEQUENCE`` after its prefix (prompt log-probs)."""
    body = {"model": server.model, "prompt": SEQUENCE, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
    response.raise_for_status()
    entries = response.json()["choices"][0]["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(SEQUENCE)
    return torch.tensor([entry[str(token)]["logprob"] for entry, token in zip(entries[1:], SEQUENCE[1:])])


def trainer_logprobs(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([SEQUENCE])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(SEQUENCE[1:])[:, None])[:, 0]


@pytest.fixture(scope="module")
def trainer_model(vllm_server: Any) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(vllm_server.model, dtype=torch.float32).eval()


@pytest.fixture
def restore(vllm_server: Any, trainer_model: torch.nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """The model's original weights; after the test they are back in the trainer model and in the server."""
    original = {name: tensor.clone() for name, tensor in trainer_model.state_dict().items()}
    yield original
    trainer_model.load_state_dict(original)
    sync = ServerWeightSync(Generator(), vllm_server.url, torch.device("cpu"), timeout_s=120)
    try:
        sync.push(trainer_model)
    finally:
        sync.close()


def perturb(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))


def test_a_weight_push_makes_the_server_generate_with_the_trainers_weights(
    vllm_server: Any, trainer_model: torch.nn.Module, restore: dict[str, torch.Tensor]
) -> None:
    before = server_logprobs(vllm_server)
    assert torch.allclose(before, trainer_logprobs(trainer_model), atol=TOLERANCE)  # same start

    generator = Generator()
    sync = ServerWeightSync(generator, vllm_server.url, torch.device("cpu"), timeout_s=120)
    try:
        assert sync.backend == "gloo" and sync.rank == sync.world_size - 1  # the trainer is the last rank
        for round_ in (1, 2):  # the group carries more than one update
            perturb(trainer_model, seed=round_)
            assert sync.push(trainer_model) == round_ == generator.policy_version
            after = server_logprobs(vllm_server)
            expected = trainer_logprobs(trainer_model)
            assert (after - expected).abs().max() < TOLERANCE, f"round {round_}: the server has other weights"
            assert (after - before).abs().max() > 0.05, "the server's log-probs did not change"
    finally:
        sync.close()


class MisdescribingSync(ServerWeightSync):
    """Announces a dtype that does not exist: the server refuses the transfer before it starts."""

    @staticmethod
    def describe(weights: list[tuple[str, torch.Tensor]]) -> list[tuple[str, str, list[int]]]:
        described = ServerWeightSync.describe(weights)
        name, _, shape = described[0]
        return [(name, "float99", shape), *described[1:]]


def test_a_failed_push_raises_and_leaves_the_servers_weights_alone(
    vllm_server: Any, trainer_model: torch.nn.Module, restore: dict[str, torch.Tensor]
) -> None:
    before = server_logprobs(vllm_server)
    perturb(trainer_model, seed=3)
    sync = MisdescribingSync(Generator(), vllm_server.url, torch.device("cpu"), timeout_s=60)
    try:
        with pytest.raises(WeightSyncError, match="float99"):  # the server's own error, through the RPC
            sync.push(trainer_model)
        with pytest.raises(WeightSyncError, match="earlier weight push failed"):  # no silent second try
            sync.push(trainer_model)
        assert sync.policy.policy_version == 0
    finally:
        sync.close()
    assert torch.allclose(server_logprobs(vllm_server), before, atol=TOLERANCE)


def test_a_server_without_the_receiver_is_refused_clearly(vllm_server: Any) -> None:
    # No /collective_rpc at that URL (as on a server started without VLLM_SERVER_DEV_MODE): the sync says how
    # to start one, instead of failing later inside a collective.
    with pytest.raises(WeightSyncError, match="VLLM_SERVER_DEV_MODE"):
        ServerWeightSync(Generator(), f"{vllm_server.url}/no-such-prefix", torch.device("cpu"), timeout_s=10)


def test_a_server_mode_run_pushes_every_update_to_its_server(
    vllm_server: Any, trainer_model: torch.nn.Module, restore: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    """The runner wiring: a run in server mode (given the session server by URL) generates there and
    leaves the server with the trained weights."""
    import json

    from rl_llm.trainers.config import load_config
    from rl_llm.trainers.grpo import train_grpo

    config = load_config(overrides=[
        "algorithm=reinforce",  # no group baseline: the update moves the weights whatever the rewards
        "rollout.backend=vllm", "rollout.vllm.mode=server", f"rollout.vllm.server_url={vllm_server.url}",
        "steps=2", "eval.episodes=2", "rollout.prompts_per_step=2", "rollout.group_size=2",
        "rollout.max_new_tokens=4", "env.kwargs={num_arms: 3, horizon: 2}", "optim.lr=0.05",
        "log.tensorboard=false", "log.progress=false", "log.plot=false", "eval.baselines=[]",
    ])  # fmt: skip
    torch.manual_seed(0)
    train_grpo(config, tmp_path)
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [step["policy_version"] for step in steps] == [1, 2]
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32).eval()
    served = server_logprobs(vllm_server)
    assert (served - trainer_logprobs(trained)).abs().max() < TOLERANCE
    assert (served - trainer_logprobs(trainer_model)).abs().max() > TOLERANCE  # it did move


def test_a_started_server_does_not_take_the_trainers_devices_blindly(monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_llm.trainers.server_sync import group_backend, server_placement

    assert server_placement(torch.device("cpu"), None) == (None, False)  # CPU: nothing to place (KV cache bounded)
    assert server_placement(torch.device("cuda", 0), "1") == ("1", True)  # rollout.vllm.server_gpus
    # Four visible GPUs (the machine's count, as CUDA reports it): the server gets the last one the trainer
    # does not use, named as CUDA_VISIBLE_DEVICES names it.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,5,7")
    assert server_placement(torch.device("cuda", 0), None) == ("7", True)
    assert server_placement(torch.device("cuda", 3), None) == ("2", True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # one GPU: shared, and no NCCL on one device
    assert server_placement(torch.device("cuda", 0), None) == (None, False)
    assert group_backend(torch.device("cuda", 0), server_on_own_gpu=False) == "gloo"
    assert group_backend(torch.device("cuda", 0), server_on_own_gpu=True) == "nccl"
    assert group_backend(torch.device("cpu"), server_on_own_gpu=True) == "gloo"


def test_a_prefix_cache_reset_counts_as_done_unless_the_server_says_it_failed() -> None:
    from rl_llm.trainers.server_sync import prefix_cache_was_reset

    assert prefix_cache_was_reset(httpx.Response(200))  # vLLM 0.25: an empty body, the result unchecked
    assert prefix_cache_was_reset(httpx.Response(200, json={"success": True}))  # 0.26+
    assert not prefix_cache_was_reset(httpx.Response(200, json={"success": False}))  # blocks still held
    assert prefix_cache_was_reset(httpx.Response(200, text="not json"))
