"""The colocated weight sync on a real vLLM engine (its CPU build here, any build elsewhere): after a push the
generator's log-probs on a fixed sequence are the trainer model's, and differ from those before the push.

One engine of the tiny model serves the whole module (a start costs about a minute on 2 cores), in float32,
with a small KV cache. It runs in its own process (vLLM's default), so the weights travel as bytes through
``collective_rpc`` into vLLM's ``reload_weights``; the in-process route (the trainer's default) calls the same
``reload_weights`` on the worker and is covered by the last test, one training step of the vllm backend.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from rl_llm.agents.vllm_backend import vllm_import_error

VLLM_MISSING = vllm_import_error()
pytestmark = pytest.mark.skipif(VLLM_MISSING is not None, reason=f"needs vLLM (CPU or GPU build): {VLLM_MISSING}")

# float32 on both sides: vLLM's kernels and transformers' agree to ~1e-6 on the tiny model.
TOLERANCE = 1e-4
SEQUENCE = [3, 17, 250, 9, 41, 77, 5, 120, 33, 64, 8, 199, 21, 90, 14, 60]


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    from rl_llm.agents import tiny_model
    from rl_llm.agents.vllm_backend import VLLMPolicy

    policy = VLLMPolicy(tiny_model(), async_engine=False, dtype="float32", max_model_len=256, seed=0,
                        enable_sleep_mode=True, kv_cache_memory_bytes=64 * 2**20)  # fmt: skip
    try:
        yield policy
    finally:
        policy.close()


@pytest.fixture
def trainer_model() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    from rl_llm.agents import tiny_model

    return AutoModelForCausalLM.from_pretrained(str(tiny_model()), dtype=torch.float32)


def generator_logprobs(policy: Any) -> torch.Tensor:
    """The engine's log-prob of each token of SEQUENCE after the first (prompt log-probs: temperature 1)."""
    import vllm

    params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    (output,) = policy.llm.generate([vllm.TokensPrompt(prompt_token_ids=SEQUENCE)], params, use_tqdm=False)
    steps = output.prompt_logprobs[1:]
    return torch.tensor([step[token].logprob for step, token in zip(steps, SEQUENCE[1:], strict=True)])


@torch.no_grad()
def trainer_logprobs(model: torch.nn.Module) -> torch.Tensor:
    logits = model(torch.tensor([SEQUENCE])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(SEQUENCE[1:])[:, None])[:, 0]


def perturb(model: torch.nn.Module, seed: int) -> None:
    """A stand-in for an optimizer step: move every weight."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))


def test_after_a_push_the_generator_scores_like_the_trainer(engine: Any, trainer_model: torch.nn.Module) -> None:
    from rl_llm.trainers.sync import InProcessSync

    before = generator_logprobs(engine)
    assert torch.allclose(before, trainer_logprobs(trainer_model), atol=TOLERANCE), "the engine starts from the model"
    sync = InProcessSync(engine, sleep=True)
    if not engine.can_sleep:  # CPU: asked for sleep mode, stays awake (and said so once)
        assert sync.sleep is False
    for seed in (1, 2):  # twice: a second reload must work on the reloaded model too
        perturb(trainer_model, seed)
        sync.before_rollout()
        sync.before_update()
        if seed == 1:
            version = sync.push(trainer_model)  # state_dict(): the tied head included
        else:  # named_parameters() of a tied model lacks the head: the policy must still replace it
            engine.load_weights(trainer_model.named_parameters())
            version = engine.policy_version
        after = generator_logprobs(engine)
        expected = trainer_logprobs(trainer_model)
        assert (after - expected).abs().max() < TOLERANCE
        assert (after - before).abs().max() > 100 * TOLERANCE, "the generator still scores with the old weights"
        before = after
    assert version == engine.policy_version == 2


def test_lora_pushes_merged_weights_and_leaves_the_base_untouched(engine: Any, trainer_model: torch.nn.Module) -> None:
    pytest.importorskip("peft", reason="LoRA needs peft (pip install 'rl-llm[trl]')")
    from rl_llm.trainers.config import LoraConfig
    from rl_llm.trainers.modeling import apply_lora
    from rl_llm.trainers.sync import InProcessSync

    model = apply_lora(copy.deepcopy(trainer_model), LoraConfig(r=4, alpha=8))
    base_before = {name: tensor.clone() for name, tensor in model.get_base_model().state_dict().items()
                   if "lora_" not in name}  # fmt: skip
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # trained adapters: B is zero at the start
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.1 * torch.randn(parameter.shape, generator=generator))
    sync = InProcessSync(engine, sleep=False)
    for _ in range(3):
        sync.push(model)
    assert (generator_logprobs(engine) - trainer_logprobs(model)).abs().max() < TOLERANCE
    base_after = model.get_base_model().state_dict()
    assert all(torch.equal(tensor, base_after[name]) for name, tensor in base_before.items())


def test_a_training_step_on_the_colocated_engine_reaches_the_generator(tmp_path, monkeypatch) -> None:
    """The trainer's own route: engine in this process (the runner's default), ``reload_weights`` on its worker."""
    from rl_llm.trainers.advantages import broadcast, grpo
    from rl_llm.trainers.config import load_config
    from rl_llm.trainers.modeling import token_logprobs
    from rl_llm.trainers.runner import TrainingRun
    from rl_llm.trainers.update import policy_update

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # what the runner sets; undone after the test
    threads = torch.get_num_threads()  # an in-process engine lowers this process's torch threads for serving
    config = load_config(overrides=[
        "rollout.backend=vllm", "rollout.max_new_tokens=8", "rollout.prompts_per_step=2", "rollout.group_size=4",
        "optim.lr=1e-3", "log.tensorboard=false", "log.progress=false", "env.kwargs={num_arms: 3, horizon: 2}", "sft.episodes=0",
    ])  # fmt: skip
    run = TrainingRun(config, tmp_path)
    try:
        assert run.generator._in_process_worker() is not None
        batch = run.score(run.collect())
        advantages = broadcast(grpo(batch.scores, batch.group_ids) + 1.0, batch.policy_mask)
        policy_update(run.model, run.optimizer, batch, advantages, config, run.shuffle)
        assert run.sync.push(run.model) == 1
        fresh = run.score(run.collect())
        assert fresh.policy_versions.tolist() == [1] * len(fresh)
        with torch.no_grad():
            ours, _ = token_logprobs(run.model, fresh.input_ids, fresh.attention_mask,
                                     config.rollout.temperature, positions=fresh.policy_mask)  # fmt: skip
            moved, _ = token_logprobs(run.model, batch.input_ids, batch.attention_mask, positions=batch.policy_mask)
        mask = fresh.policy_mask
        assert (ours[mask] - fresh.old_logprobs[mask]).abs().max() < TOLERANCE
        # the update moved the model: the first batch's recorded log-probs are no longer the trainer's
        assert (moved[batch.policy_mask] - batch.old_logprobs[batch.policy_mask]).abs().max() > 100 * TOLERANCE
    finally:
        run.close()
        torch.set_num_threads(threads)
