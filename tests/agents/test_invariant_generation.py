"""The CPU batch-invariant layout: a request's bits do not depend on its batch, in any position, on any thread
count, across padded widths (one merged decode), and the one-query attention is SDPA's attention."""

from __future__ import annotations

import random
import warnings

import pytest
import torch
import torch.nn.functional as F

from rl_llm.agents.invariant_generation import (
    ATTENTION,
    PAD_MULTIPLE,
    batch_invariant_attention,
    canonical_width,
)
from rl_llm.agents.llm import GenerationRequest


class _Attention(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.eval()


def _inputs(rows: int, keys: int, heads: int = 4, kv_heads: int = 2, dim: int = 32, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(rows, heads, 1, dim, generator=generator)
    key = torch.randn(rows, kv_heads, keys, dim, generator=generator)
    value = torch.randn(rows, kv_heads, keys, dim, generator=generator)
    mask = torch.ones(rows, 1, 1, keys, dtype=torch.bool)
    for row in range(rows):  # each row its own amount of left padding
        mask[row, ..., : (7 * row) % keys] = False
    return query, key, value, mask


@pytest.mark.parametrize("keys", [33, 130, 515, 1100])
def test_one_query_attention_equals_sdpa_and_ignores_position_padding_and_threads(keys: int) -> None:
    module = _Attention(groups=2)
    query, key, value, mask = _inputs(8, keys)
    out, _ = batch_invariant_attention(module, query, key, value, mask, scaling=32**-0.5)
    reference = F.scaled_dot_product_attention(query, key.repeat_interleave(2, 1), value.repeat_interleave(2, 1),
                                               attn_mask=mask).transpose(1, 2)  # fmt: skip
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)
    threads = torch.get_num_threads()
    for row in (0, 5, 7):
        alone, _ = batch_invariant_attention(module, query[row : row + 1], key[row : row + 1], value[row : row + 1],
                                             mask[row : row + 1], scaling=32**-0.5)  # fmt: skip
        assert torch.equal(alone[0], out[row]), f"row {row}: its bits depend on the batch"
        # 64 more masked keys on the left (a wider prompt in the same decode): the same bits.
        padded, _ = batch_invariant_attention(
            module, query[row : row + 1], F.pad(key[row : row + 1], (0, 0, 64, 0)),
            F.pad(value[row : row + 1], (0, 0, 64, 0)), F.pad(mask[row : row + 1], (64, 0), value=False),
            scaling=32**-0.5,
        )  # fmt: skip
        assert torch.equal(padded[0], out[row]), f"row {row}: its bits depend on the left padding"
        try:
            torch.set_num_threads(1)
            single, _ = batch_invariant_attention(module, query, key, value, mask, scaling=32**-0.5)
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(single[row], out[row]), f"row {row}: its bits depend on the thread count"


def test_prefill_and_training_forwards_stay_transformers_sdpa() -> None:
    module = _Attention(groups=1)
    query, key, value, _ = _inputs(2, 40, heads=2, kv_heads=2)
    query = torch.randn(2, 2, 40, 32)
    out, _ = batch_invariant_attention(module, query, key, value, None, scaling=32**-0.5, is_causal=True)
    reference = F.scaled_dot_product_attention(query, key, value, is_causal=True).transpose(1, 2)
    assert torch.equal(out, reference)


def _requests(lengths: list[int], seed: int, max_new_tokens: list[int] | None = None,
              stop: tuple[str, ...] = ()) -> list[GenerationRequest]:  # fmt: skip
    generator = torch.Generator().manual_seed(seed)
    return [
        GenerationRequest(messages=[], prompt_ids=torch.randint(5, 1000, (n,), generator=generator).tolist(), stop=stop,
                          max_new_tokens=None if max_new_tokens is None else max_new_tokens[i % len(max_new_tokens)],
                          metadata={"seed": seed, "group_index": i, "turn": 0})
        for i, n in enumerate(lengths)
    ]  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1])
def test_every_row_of_a_large_batch_matches_its_request_alone(make_tiny_policy, seed: int) -> None:
    # Eight or more rows of one padded width put rows on the second thread of a 2-thread CPU (the flash-attention
    # kernel gave those rows other bits); other rows straddle widths, so the decode merges widths.
    policy = make_tiny_policy(temperature=1.0, top_p=0.9, max_new_tokens=12, seed=seed)
    one_width = [4 * PAD_MULTIPLE + 1 + (i * (PAD_MULTIPLE - 2)) // 8 for i in range(8)]
    lengths = [*one_width, 5, 33, 64, 140, 200]
    assert len({canonical_width(n) for n in lengths[:8]}) == 1
    requests = _requests(lengths, seed, max_new_tokens=[12, 1, 5])
    alone = [policy.generate([request])[0] for request in requests]
    rng = random.Random(seed)
    for _ in range(3):
        order = rng.sample(range(len(requests)), k=len(requests))
        together = policy.generate([requests[i] for i in order])
        for i, completion in zip(order, together):
            expected = alone[i]
            assert (completion.token_ids, completion.logprobs, completion.finish_reason) == \
                (expected.token_ids, expected.logprobs, expected.finish_reason), f"request {i} (length {lengths[i]})"  # fmt: skip
    assert [len(c.token_ids) for c in alone[:3]] == [12, 1, 5]  # per-row limits survive the merged decode


def test_stop_strings_and_first_token_ends_survive_the_merged_decode(make_tiny_policy) -> None:
    policy = make_tiny_policy(temperature=1.0, max_new_tokens=16, seed=2)
    vocabulary_text = policy.tokenizer.decode(list(range(5, 200)))
    stop = (next(char for char in vocabulary_text if char.isalpha()),)  # a common character: rows stop early
    requests = _requests([20, 40, 60, 100, 130, 160], 3, stop=stop)
    alone = [policy.generate([request])[0] for request in requests]
    together = policy.generate(requests)
    assert [(c.token_ids, c.logprobs, c.finish_reason, c.text) for c in together] == \
        [(c.token_ids, c.logprobs, c.finish_reason, c.text) for c in alone]  # fmt: skip
    stopped = [c for c in alone if c.finish_reason == "stop"]
    assert stopped, "the stop string never ended a row: the test checks nothing"
    for completion in stopped:
        assert completion.text.count(stop[0]) >= 1


def test_a_batch_invariant_policy_decodes_with_the_invariant_attention(make_tiny_policy) -> None:
    policy = make_tiny_policy(max_new_tokens=2)
    policy.generate(_requests([10], 0))
    assert policy.model.config._attn_implementation == ATTENTION


def test_a_module_in_training_mode_generates_as_in_eval_mode_and_stays_in_training_mode(make_tiny_policy) -> None:
    # The trainer hands its own module to the policy between updates, in training mode.
    policy = make_tiny_policy(temperature=1.0, max_new_tokens=6, seed=4)
    requests = _requests([*range(40, 48), 90], 5)
    expected = [(c.token_ids, c.logprobs) for c in policy.generate(requests)]
    policy.model.train()
    assert [(c.token_ids, c.logprobs) for c in policy.generate(requests[::-1])][::-1] == expected
    assert policy.model.training


def test_the_cache_goes_by_the_name_the_installed_transformers_takes(make_tiny_policy) -> None:
    # transformers 5.2x renamed `past_key_values` to `cache` (the old name warns, and goes in 5.40): the merged
    # decode must pass its prefilled cache under whichever name the installed version reads.
    policy = make_tiny_policy(temperature=1.0, max_new_tokens=4, seed=1)
    requests = _requests([12, 40, 90], 2)  # three widths: prefilled apart, decoded together from the cache
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*", category=FutureWarning)
        completions = policy.generate(requests)
    assert [c.token_ids for c in completions] == [policy.generate([r])[0].token_ids for r in requests]
