"""The per-request seeded sampler (agents/sampling.py): the hash, the draw's distribution, filtering, devices."""

from __future__ import annotations

import random

import pytest
import torch

from rl_llm.agents.sampling import filtered_logits, mix32, sample_tokens, seeded_uniforms


def lowbias32_reference(x: int) -> int:
    """Chris Wellons' lowbias32 in plain Python integers (the function mix32 emulates with 16-bit limbs)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_mix32_is_lowbias32_without_int64_overflow() -> None:
    rng = random.Random(0)
    values = [0, 1, 0xFFFF, 0x10000, 0xFFFFFFFF, *(rng.getrandbits(32) for _ in range(2000))]
    mixed = mix32(torch.tensor(values, dtype=torch.int64)).tolist()
    assert mixed == [lowbias32_reference(v) for v in values]


def test_uniforms_are_a_pure_function_of_seed_and_step_and_look_uniform() -> None:
    seeds = torch.arange(20_000, dtype=torch.int64) * 7_919 + (1 << 61)  # high bits set: both halves used
    first = seeded_uniforms(seeds, 3)
    assert torch.equal(first, seeded_uniforms(seeds, 3))
    assert torch.equal(first[5:9], seeded_uniforms(seeds[5:9], 3)), "a seed's draw does not depend on its batch"
    assert not torch.equal(first, seeded_uniforms(seeds, 4))
    assert float(first.min()) > 0.0 and float(first.max()) < 1.0
    counts = torch.histc(first, bins=10, min=0.0, max=1.0)
    assert float(counts.min()) > 1_800 and float(counts.max()) < 2_200  # 2,000 expected per bin
    later = seeded_uniforms(seeds, 4)
    correlation = torch.corrcoef(torch.stack([first, later]))[0, 1]
    assert abs(float(correlation)) < 0.03


def test_draws_follow_softmax_of_logits_over_temperature() -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -30.0])
    temperature = 0.7
    n = 40_000
    tokens, logprobs = sample_tokens(logits.expand(n, -1), torch.arange(n, dtype=torch.int64), 0,
                                     temperature=temperature, logprob_temperature=temperature)  # fmt: skip
    frequencies = torch.bincount(tokens, minlength=5).double() / n
    expected = torch.softmax(logits.double() / temperature, dim=0)
    assert torch.allclose(frequencies, expected, atol=0.01)
    assert torch.allclose(logprobs, torch.log_softmax(logits / temperature, dim=0)[tokens])


def test_top_k_and_top_p_keep_the_nucleus_only() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.07, 0.03]]))
    assert torch.isinf(filtered_logits(logits, 1.0, top_k=2)).tolist() == [[False, False, True, True, True]]
    # smallest set reaching 0.8: 0.5 + 0.25 = 0.75 < 0.8, so the third token is in
    assert torch.isinf(filtered_logits(logits, 1.0, top_p=0.8)).tolist() == [[False, False, False, True, True]]
    assert torch.isinf(filtered_logits(logits, 1.0, top_p=0.75)).tolist() == [[False, False, True, True, True]]
    n = 5_000
    tokens, logprobs = sample_tokens(logits.expand(n, -1), torch.arange(n, dtype=torch.int64), 0,
                                     temperature=1.0, top_p=0.8)  # fmt: skip
    assert set(tokens.tolist()) == {0, 1, 2}
    # log-probs are those before filtering
    assert torch.allclose(logprobs, torch.log_softmax(logits[0], dim=0)[tokens])


def test_a_token_of_zero_probability_is_never_drawn_even_at_the_end_of_the_vocabulary() -> None:
    # Only the first token is possible: every uniform, however close to 1, must give it.
    logits = torch.tensor([[0.0, -float("inf"), -float("inf"), -float("inf")]])
    n = 20_000
    tokens, _ = sample_tokens(logits.expand(n, -1), torch.arange(n, dtype=torch.int64), 0, temperature=1.0)
    assert set(tokens.tolist()) == {0}
    masked_tail = torch.tensor([[0.0, 0.1, 3.0, 3.0]])  # top-k 2 masks the first two: the tail is all there is
    tokens, _ = sample_tokens(masked_tail.expand(n, -1), torch.arange(n, dtype=torch.int64), 0, temperature=1.0, top_k=2)
    assert set(tokens.tolist()) == {2, 3}


def test_greedy_takes_the_argmax_with_plain_log_probs() -> None:
    logits = torch.tensor([[0.1, 3.0, -1.0], [5.0, 0.0, 4.9]])
    tokens, logprobs = sample_tokens(logits, torch.tensor([1, 2]), 0, temperature=0.0)
    assert tokens.tolist() == [1, 0]
    assert torch.allclose(logprobs, torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0])


def test_a_row_draws_the_same_token_alone_or_in_any_batch() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 1000, generator=generator) * 3
    seeds = torch.randint(0, 2**62, (16,), generator=generator)
    together, together_lp = sample_tokens(logits, seeds, 5, temperature=1.0, top_p=0.9, top_k=50)
    for row in (0, 7, 15):
        alone, alone_lp = sample_tokens(logits[row : row + 1], seeds[row : row + 1], 5, temperature=1.0, top_p=0.9, top_k=50)
        assert alone.item() == together[row].item() and alone_lp.item() == together_lp[row].item()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_nothing_is_created_on_the_default_device(temperature: float) -> None:
    # Inputs on the CPU, the default device elsewhere: a tensor made without a device would land on `meta`
    # and fail to mix with the inputs, or come back on `meta`.
    logits, seeds = torch.randn(4, 50), torch.arange(4, dtype=torch.int64)
    with torch.device("meta"):
        tokens, logprobs = sample_tokens(logits, seeds, 2, temperature=temperature, top_k=10, top_p=0.9)
    assert tokens.device == logprobs.device == logits.device


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_hf_generation_creates_nothing_on_the_default_device(make_tiny_policy, batch_invariant: bool) -> None:
    # The model and every tensor generation makes follow the model's device: run it with `meta` as the default
    # device and the same tokens and log-probs come back (a stray device-less tensor would fail to mix).
    from rl_llm.agents.llm import GenerationRequest

    policy = make_tiny_policy(temperature=1.0, top_p=0.9, max_new_tokens=6, seed=1)
    policy.batch_invariant = batch_invariant
    requests = [GenerationRequest(messages=[], prompt_ids=list(range(5, 5 + n)), stop=("e",),
                                  metadata={"seed": 1, "group_index": i, "turn": 0}) for i, n in enumerate((3, 40, 7))]  # fmt: skip
    expected = policy.generate(requests)
    with torch.device("meta"):
        got = policy.generate(requests)
    assert [(c.token_ids, c.logprobs) for c in got] == [(c.token_ids, c.logprobs) for c in expected]


@pytest.mark.parametrize("stops", [("e", "a"), ("</move>", "t>"), ("é",), ("x\n",)])
def test_stop_checks_skipped_by_the_candidate_mask_change_nothing(make_tiny_policy, monkeypatch, stops) -> None:
    # Rows whose newest token cannot end a stop string are not decoded; completions must be exactly those of
    # checking every row at every step.
    from rl_llm.agents.llm import GenerationRequest

    policy = make_tiny_policy(temperature=1.0, max_new_tokens=24, seed=2)
    requests = [GenerationRequest(messages=[], prompt_ids=list(range(7, 7 + n)), stop=stops,
                                  metadata={"seed": 5, "group_index": i, "turn": 0}) for i, n in enumerate((4, 9, 30, 12))]  # fmt: skip
    fast = policy.generate(requests)
    mask = policy.stop_candidates([stops])
    if any(s[-1].isspace() for s in stops):
        assert mask is None
    else:
        assert mask is not None and 0 < int(mask.sum()) < mask.numel()
    monkeypatch.setattr(policy, "stop_candidates", lambda _stops: None)
    assert [(c.token_ids, c.finish_reason) for c in policy.generate(requests)] == [(c.token_ids, c.finish_reason) for c in fast]
