"""The vllm backend: the in-process engine where vLLM is installed, and the server client everywhere.

The engine tests need vLLM (a GPU build, or its CPU build); where it does not import they are skipped with
the import error as the reason. The server client speaks vLLM's ``/v1/completions`` protocol and is tested
against a real HTTP server on 127.0.0.1 that generates with the tiny model. How ``VLLMPolicy`` drives an
engine (its options, weights shipped to another process) is also checked everywhere, with a stand-in ``vllm``.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rl_llm.agents import make_policy, vllm_backend
from rl_llm.agents.llm import SamplingParams
from rl_llm.agents.rollout import collect
from rl_llm.agents.vllm_backend import vllm_import_error
from rl_llm.agents.vllm_server import VLLMServerPolicy
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
    # penalties sent as no-ops: a server fills missing ones from the model's generation_config
    penalties = ("repetition_penalty", "min_p", "presence_penalty", "frequency_penalty")
    assert [body[name] for name in penalties] == [1.0, 0.0, 0.0, 0.0]
    policy.close()


def test_a_server_with_raw_log_probs_gives_trajectories_of_temperature_one(completions_server: CompletionsStub,
                                                                           tiny_model_dir: Path) -> None:  # fmt: skip
    policy = VLLMServerPolicy(completions_server.url, str(tiny_model_dir), raw_logprobs=True,
                              sampling=SamplingParams(max_new_tokens=4, temperature=0.8))  # fmt: skip
    (trajectory,) = collect("rl-llm/TicTacToe-v0", policy, seeds=[0])
    assert trajectory.temperature == 1.0 and policy.logprob_temperature == 1.0
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


def stand_in_vllm(monkeypatch: pytest.MonkeyPatch, engine_options: list[str], worker: Any) -> list[tuple[str, Any]]:
    """A stand-in ``vllm`` module: ``EngineArgs`` takes ``engine_options``; ``LLM`` runs its engine core
    "in another process" (no model in reach) whose ``collective_rpc`` calls reach ``worker``. Returns the calls."""
    calls: list[tuple[str, Any]] = []

    class LLM:
        def __init__(self, **options: Any) -> None:
            calls.append(("LLM", options))
            self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=777))

        def collective_rpc(self, method: str, args: tuple = ()) -> list[Any]:
            calls.append(("collective_rpc", method))
            return [getattr(vllm_backend.WeightLoader, method)(worker, *args)]

        def reset_prefix_cache(self) -> None:
            calls.append(("reset_prefix_cache", None))

    fake = types.ModuleType("vllm")
    fake.EngineArgs = dataclasses.make_dataclass("EngineArgs", [(name, Any, None) for name in engine_options])
    fake.LLM = LLM
    sampling = types.ModuleType("vllm.sampling_params")
    sampling.RequestOutputKind = SimpleNamespace(FINAL_ONLY="final-only")
    platforms = types.ModuleType("vllm.platforms")  # a GPU platform with sleep mode
    platforms.current_platform = SimpleNamespace(is_sleep_mode_available=lambda: True, is_cpu=lambda: False,
                                                 device_name="cuda")  # fmt: skip
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sampling)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    return calls


@pytest.mark.parametrize("vllm_version", ["current", "before 0.10.2"])
def test_engine_options_and_weights_shipped_to_an_engine_in_another_process(
    vllm_version: str, monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, make_tiny_policy
) -> None:
    import torch

    class VLLMStyleWorker:  # vLLM workers reload weights given as (name, tensor) pairs
        def __init__(self, module: torch.nn.Module) -> None:
            self.device = torch.device("cpu")
            self.parameters = dict(module.named_parameters())
            self.reloads: list[list[str]] = []

        def reload_weights(self, weights_iterator: Any, is_checkpoint_format: bool) -> None:
            assert is_checkpoint_format
            self.reloads.append([])
            with torch.no_grad():
                for name, tensor in weights_iterator:
                    self.parameters[name].copy_(tensor)
                    self.reloads[-1].append(name)

    source, target = make_tiny_policy().model, make_tiny_policy().model
    with torch.no_grad():
        for parameter in target.parameters():
            parameter.zero_()
    worker = VLLMStyleWorker(target)
    options = ["model", "seed", "gpu_memory_utilization", "dtype", "enable_sleep_mode", "max_model_len"]
    if vllm_version == "current":
        options += ["logprobs_mode", "worker_extension_cls"]
    calls = stand_in_vllm(monkeypatch, options, worker)
    monkeypatch.setattr(vllm_backend, "WEIGHT_PART_BYTES", 100_000)  # several parts

    policy = vllm_backend.VLLMPolicy(tiny_model_dir, async_engine=False, sampling=SamplingParams(temperature=0.7))
    engine_options = calls[0][1]
    assert policy.max_context_tokens == 777, "the engine's context length bounds the episodes"
    if vllm_version != "current":  # no logprobs_mode: log-probs at temperature 1; no worker extensions
        assert policy.logprob_temperature == 1.0 and "logprobs_mode" not in engine_options
        with pytest.raises(RuntimeError, match="VLLM_ENABLE_V1_MULTIPROCESSING=0"):
            policy.load_weights(source.named_parameters())
        return
    assert engine_options["logprobs_mode"] == "processed_logprobs" and policy.logprob_temperature == 0.7
    assert engine_options["worker_extension_cls"] == vllm_backend.WEIGHT_LOADER
    policy.load_weights(source.named_parameters())
    shipped = [call for call in calls if call[0] == "collective_rpc"]
    assert len(shipped) > 1 and calls[-1] == ("reset_prefix_cache", None) and policy.policy_version == 1
    for (name, expected), loaded in zip(source.named_parameters(), target.parameters(), strict=True):
        assert torch.equal(expected, loaded), name
    # vLLM reloads layer by layer: a transformer block never straddles two calls
    blocks = [{vllm_backend._layer_of(name) for name in names} for names in worker.reloads]
    assert all(not (a & b) for i, a in enumerate(blocks) for b in blocks[i + 1 :])
    assert vllm_backend._layer_of("model.layers.3.self_attn.q_proj.weight") == "model.layers.3"


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


def test_module_globals_that_break_vllms_kernel_scan_are_hidden_only_while_an_engine_starts() -> None:
    """vLLM 0.32's CPU platform calls ``vars(v).get`` on every module global when an in-process engine starts;
    an object answering every attribute (llvmlite's ``ffi.lib``, loaded with numba) made that start fail."""
    import sys
    import types

    from rl_llm.agents.vllm_backend import _hide_odd_module_globals

    class AnswersEverything:
        __slots__ = ()

        def __getattr__(self, name: str) -> object:
            return lambda *args: None

    class Deprecated:  # like torch.distributed.reduce_op: any attribute read warns
        def __getattribute__(self, name: str) -> object:
            warnings.warn("Deprecated is deprecated", FutureWarning, stacklevel=2)
            return object.__getattribute__(self, name)

    module = types.ModuleType("rl_llm_test_odd_globals")
    module.lib, module.table, module.kind, module.old = AnswersEverything(), {"a": 1}, dict, Deprecated()
    sys.modules[module.__name__] = module
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with _hide_odd_module_globals():
                pass
        assert not [w for w in caught if issubclass(w.category, FutureWarning)]  # the look is not a use
        del module.old
        with _hide_odd_module_globals():
            assert not hasattr(module, "lib")  # would break vLLM's scan
            assert module.table == {"a": 1} and module.kind is dict  # mappings and classes stay
            for value in list(vars(module).values()):
                if hasattr(value, "__dict__"):
                    vars(value).get("kernel")  # what vLLM does: no error now
        assert isinstance(module.lib, AnswersEverything)  # put back
    finally:
        del sys.modules[module.__name__]
