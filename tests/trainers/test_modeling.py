"""Per-token log-probs, the critic and the update step on the real tiny model and real rollouts."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from rl_llm.agents.hf import HFPolicy
from rl_llm.agents.llm import SamplingParams
from rl_llm.agents.rollout import collect
from rl_llm.agents.tiny import tiny_model
from rl_llm.trainers.advantages import broadcast, grpo
from rl_llm.trainers.batch import collate
from rl_llm.trainers.config import load_config
from rl_llm.trainers.modeling import Critic, token_logprobs
from rl_llm.trainers.update import policy_update

ENV = "rl-llm/MultiArmedBandit-v0"


@pytest.fixture(scope="module")
def tiny():
    path = tiny_model()
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def rollouts(tiny):
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer, sampling=SamplingParams(max_new_tokens=4, temperature=1.0))
    torch.manual_seed(1)
    return collect(ENV, policy, seeds=[0, 1], group_size=3, env_kwargs={"num_arms": 3, "horizon": 2})


def test_rollout_logprobs_match_a_fresh_forward_pass(tiny, rollouts) -> None:
    model, tokenizer = tiny
    batch = collate(rollouts, tokenizer.pad_token_id)
    with torch.no_grad():
        logprobs, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, positions=batch.policy_mask)
    assert batch.num_policy_tokens > 0
    assert torch.allclose(logprobs[batch.policy_mask], batch.old_logprobs[batch.policy_mask], atol=1e-4)


def test_selected_positions_equal_the_full_computation_with_gradients(tiny, rollouts) -> None:
    model, tokenizer = tiny
    batch = collate(rollouts, tokenizer.pad_token_id)
    mask = batch.policy_mask
    full, full_entropy = token_logprobs(model, batch.input_ids, batch.attention_mask, 0.7, with_entropy=True)
    sparse, sparse_entropy = token_logprobs(model, batch.input_ids, batch.attention_mask, 0.7, True, positions=mask)
    assert torch.allclose(full[mask], sparse[mask], atol=1e-5)
    assert torch.allclose(full_entropy[mask], sparse_entropy[mask], atol=1e-5)
    assert (sparse[~mask] == 0).all()
    weight = model.get_output_embeddings().weight
    (grad_full,) = torch.autograd.grad(full[mask].sum(), weight)
    (grad_sparse,) = torch.autograd.grad(sparse[mask].sum(), weight)
    assert torch.allclose(grad_full, grad_sparse, atol=1e-5)


def test_scoring_passes_build_no_kv_cache(tiny, rollouts, monkeypatch: pytest.MonkeyPatch) -> None:
    # A scoring forward has no next token to decode: a cache of every layer's keys and values (the model's
    # default) would only hold memory, all layers at once in the no-grad passes (old log-probs, reference).
    model, tokenizer = tiny
    batch = collate(rollouts, tokenizer.pad_token_id)
    built = []
    original = DynamicCache.__init__

    def counting(self, *args, **kwargs) -> None:
        built.append(type(self).__name__)
        original(self, *args, **kwargs)

    monkeypatch.setattr(DynamicCache, "__init__", counting)
    model.train()
    try:
        with torch.no_grad():
            token_logprobs(model, batch.input_ids, batch.attention_mask, positions=batch.policy_mask)
            token_logprobs(model, batch.input_ids, batch.attention_mask)
            Critic(model)(batch.input_ids, batch.attention_mask)
    finally:
        model.eval()
    assert built == []
    model(input_ids=batch.input_ids[:1], attention_mask=batch.attention_mask[:1])  # the model's own default
    assert built, "the model builds no cache by default: this test checks nothing"


def test_critic_value_at_t_depends_only_on_tokens_before_t(tiny) -> None:
    model, _ = tiny
    critic = Critic(model)
    torch.nn.init.normal_(critic.head.weight)
    ids = torch.randint(0, 100, (1, 8))
    changed = ids.clone()
    changed[0, 5] = (ids[0, 5] + 1) % 100
    mask = torch.ones_like(ids)
    with torch.no_grad():
        before, after = critic(ids, mask), critic(changed, mask)
    assert before.shape == (1, 8) and before[0, 0] == 0
    assert torch.allclose(before[0, :6], after[0, :6]) and not torch.allclose(before[0, 6:], after[0, 6:])
    assert critic.trunk is not model.get_decoder()  # a copy: training the critic leaves the policy alone


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean", "seq_sum_constant"])
def test_gradient_accumulation_gives_the_full_batch_gradient(tiny, rollouts, aggregation: str) -> None:
    model, tokenizer = tiny
    batch = collate(rollouts, tokenizer.pad_token_id)
    advantages = broadcast(grpo(batch.scores, batch.group_ids) + 0.3, batch.policy_mask)
    grads = []
    for micro in (len(batch), 2):
        config = load_config(overrides=[f"optim.micro_batch_size={micro}", f"loss.aggregation={aggregation}",
                                        "rollout.max_new_tokens=4", "optim.max_grad_norm=1e9"])  # fmt: skip
        clone = copy.deepcopy(model)
        optimizer = torch.optim.SGD(clone.parameters(), lr=0.0)
        stats = policy_update(clone, optimizer, batch, advantages, config, torch.Generator().manual_seed(0))
        assert stats["logprob_gap_generator"] < 1e-4 and stats["approx_kl_old"] == pytest.approx(0, abs=1e-7)
        grads.append(torch.cat([p.grad.flatten() for p in clone.parameters() if p.grad is not None]))
    assert grads[0].abs().sum() > 0
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_k3_kl_to_the_frozen_reference_starts_at_zero_and_grows(tiny, rollouts) -> None:
    from rl_llm.trainers.modeling import FrozenReference

    model, tokenizer = tiny
    model = copy.deepcopy(model)
    batch = collate(rollouts, tokenizer.pad_token_id)
    advantages = broadcast(grpo(batch.scores, batch.group_ids) + 1.0, batch.policy_mask)
    config = load_config(overrides=["loss.kl_coef=0.1", "optim.lr=1e-2", "rollout.max_new_tokens=4"])
    reference = FrozenReference(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = policy_update(model, optimizer, batch, advantages, config, torch.Generator(), reference.logprobs)
    second = policy_update(model, optimizer, batch, advantages, config, torch.Generator(), reference.logprobs)
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-6)
    assert second["kl_ref"] > 1e-4


def test_lora_trains_adapters_only_and_merged_weights_load_into_the_plain_model(tiny, rollouts) -> None:
    pytest.importorskip("peft", reason="LoRA needs peft (pip install 'rl-llm[trl]')")
    from rl_llm.trainers.config import LoraConfig
    from rl_llm.trainers.modeling import apply_lora, trainable_state
    from rl_llm.trainers.sync import merged_weights

    model, tokenizer = tiny
    plain_before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    lora_model = apply_lora(copy.deepcopy(model), LoraConfig(r=4, alpha=8))
    batch = collate(rollouts, tokenizer.pad_token_id)
    advantages = broadcast(grpo(batch.scores, batch.group_ids) + 1.0, batch.policy_mask)
    config = load_config(overrides=["optim.lr=1e-2", "rollout.max_new_tokens=4"])
    optimizer = torch.optim.AdamW([p for p in lora_model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):  # the B matrices start at 0: the second step moves the model
        policy_update(lora_model, optimizer, batch, advantages, config, torch.Generator())
    state = trainable_state(lora_model)
    assert state and all("lora_" in name for name in state)

    fresh = copy.deepcopy(model)
    with merged_weights(lora_model) as named:
        fresh.load_state_dict(dict(named), strict=True)
    with torch.no_grad():
        ids, mask = batch.input_ids, batch.attention_mask
        expected = lora_model(input_ids=ids, attention_mask=mask).logits
        merged = fresh(input_ids=ids, attention_mask=mask).logits
        unchanged = model(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(merged, expected, atol=1e-4)
    assert not torch.allclose(merged, unchanged, atol=1e-4)
    assert all(torch.equal(plain_before[name], tensor) for name, tensor in model.state_dict().items())
