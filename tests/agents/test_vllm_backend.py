"""The vllm backend: the in-process engine where vLLM is installed, and the server client everywhere.

The engine tests need vLLM (a GPU build, or its CPU build); where it does not import they are skipped with
the import error as the reason. The server client speaks vLLM's ``/v1/completions`` protocol and is tested
against a real HTTP server on 127.0.0.1 that generates with the tiny model.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_llm.agents import make_policy
from rl_llm.agents.llm import SamplingParams
from rl_llm.agents.rollout import collect
from rl_llm.agents.vllm_backend import VLLMServerPolicy, vllm_import_error
from tests.agents.stub_servers import CompletionsStub
from tests.agents.trajectory_checks import assert_logprobs_match_forward_pass, assert_token_bookkeeping

VLLM_MISSING = vllm_import_error()
needs_vllm = pytest.mark.skipif(VLLM_MISSING is not None, reason=f"needs vLLM: {VLLM_MISSING}")
# vLLM's kernels are not the transformers ones; in float32 they agree to well under this.
VLLM_LOGPROB_TOLERANCE = 2e-3


@pytest.fixture
def completions_server(make_tiny_policy) -> Iterator[CompletionsStub]:
    server = CompletionsStub(make_tiny_policy(temperature=0.8))
    yield server
    server.close()


def test_server_client_is_token_in_token_out(completions_server: CompletionsStub, tiny_model_dir: Path) -> None:
    reference = completions_server.policy
    policy = VLLMServerPolicy(completions_server.url.removesuffix("/v1"), str(tiny_model_dir),
                              sampling=SamplingParams(max_new_tokens=10, temperature=0.8))  # fmt: skip
    trajectories = collect("rl-llm/TicTacToe-v0", policy, seeds=[0, 1], group_size=2)
    for trajectory in trajectories:
        assert trajectory.error is None and (trajectory.terminated or trajectory.truncated)
        assert_token_bookkeeping(trajectory, policy)
        assert_logprobs_match_forward_pass(trajectory, reference.model)
    body = completions_server.requests[0]["body"]
    assert isinstance(body["prompt"], list) and body["stop"] == ["</move>"] and body["logprobs"] == 1
    assert body["include_stop_str_in_output"] is True
    policy.close()


def test_server_client_rejects_a_server_that_does_not_return_token_ids(completions_server: CompletionsStub,
                                                                       tiny_model_dir: Path) -> None:  # fmt: skip
    policy = VLLMServerPolicy(completions_server.url, str(tiny_model_dir), max_retries=0)
    parse = policy._parse
    with pytest.raises(ValueError, match="token_id:N"):
        parse({"choices": [{"text": "x", "logprobs": {"tokens": ["x"], "token_logprobs": [-1.0]}}]})
    with pytest.raises(ValueError, match="is this a vLLM server"):
        parse({"choices": [{"text": "x"}]})
    assert policy.base_url.endswith("/v1")
    wrong = VLLMServerPolicy(completions_server.url.replace("/v1", "/nope"), str(tiny_model_dir), max_retries=0)
    (trajectory,) = collect("rl-llm/TicTacToe-v0", wrong, seeds=[0])
    assert "HTTP 400" in trajectory.error  # every trajectory comes back, with the reason


def test_without_vllm_the_engine_backends_say_how_to_get_it() -> None:
    if VLLM_MISSING is None:
        pytest.skip("vLLM is installed here; this checks the message shown where it is not")
    with pytest.raises(ImportError, match=r"pip install 'rl-llm\[vllm\]'"):
        make_policy("vllm:tiny", "rl-llm/TicTacToe-v0")
    with pytest.raises(ImportError, match="vLLM is not installed"):
        make_policy("vllm-serve:tiny", "rl-llm/TicTacToe-v0")


@needs_vllm
@pytest.mark.parametrize("async_engine", [True, False])
def test_vllm_engine_plays_token_in_token_out(async_engine: bool, tiny_model_dir: Path, make_tiny_policy) -> None:
    from rl_llm.agents.vllm_backend import VLLMPolicy

    policy = VLLMPolicy(tiny_model_dir, sampling=SamplingParams(max_new_tokens=12, temperature=0.8),
                        async_engine=async_engine, dtype="float32", gpu_memory_utilization=0.2,
                        max_model_len=2048, enforce_eager=True)  # fmt: skip
    try:
        trajectories = collect("rl-llm/TicTacToe-v0", policy, seeds=[0, 1], group_size=2)
        reference = make_tiny_policy().model.to("cpu")
        for trajectory in trajectories:
            assert trajectory.error is None
            assert_token_bookkeeping(trajectory, policy)
            assert_logprobs_match_forward_pass(trajectory, reference, VLLM_LOGPROB_TOLERANCE)
    finally:
        policy.close()


@needs_vllm
def test_vllm_engine_takes_new_weights_and_sleeps(tiny_model_dir: Path, make_tiny_policy) -> None:
    import torch

    from rl_llm.agents.vllm_backend import VLLMPolicy

    policy = VLLMPolicy(tiny_model_dir, sampling=SamplingParams(max_new_tokens=8, temperature=0.0),
                        async_engine=False, dtype="float32", gpu_memory_utilization=0.2, max_model_len=2048,
                        enable_sleep_mode=True, enforce_eager=True)  # fmt: skip
    try:
        before = collect("rl-llm/TicTacToe-v0", policy, seeds=[3])[0]
        reference = make_tiny_policy().model
        with torch.no_grad():
            for parameter in reference.parameters():
                parameter.add_(0.05 * torch.randn_like(parameter))
        policy.sleep()
        policy.wake_up()
        policy.load_weights(reference.named_parameters())
        after = collect("rl-llm/TicTacToe-v0", policy, seeds=[3])[0]
        assert (before.policy_version, after.policy_version) == (0, 1)
        assert_logprobs_match_forward_pass(after, reference, VLLM_LOGPROB_TOLERANCE)
    finally:
        policy.close()
