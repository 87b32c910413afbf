"""Per-request seeded sampling for a whole batch at once, on any device.

Each request names its own random stream with a 62-bit seed (``HFPolicy.request_seed``), so a request's draw
never depends on the other requests in its batch. Instead of one ``torch.Generator`` per row (a Python loop
and a host sync per row per token, and CPU-only generators for CUDA logits), the uniform number of row ``b``
at step ``t`` is a counter-based hash of ``(seed_b, t)`` computed with integer tensor ops on the logits'
device: the same integers on CPU and CUDA, one kernel for the whole batch. The token is then drawn by
inverse transform sampling, ``the first token whose cumulative probability exceeds u``.

The hash is Chris Wellons' ``lowbias32`` integer mixer, done in int64 with 16-bit limbs so that no product
overflows (int64 wrap-around is undefined behaviour in the C++ kernels).
"""

from __future__ import annotations

import threading

import torch

MASK32 = 0xFFFFFFFF
# PyTorch's deterministic mode is one switch for the whole process. A trainer makes it strict around its
# backward passes (rl_llm.trainers.modeling.strict_determinism), where an op with no deterministic CUDA kernel
# raises instead of warning; the sampler's cumsum below is one. Generation on another thread meanwhile (the
# asynchronous loop's hf generator) would then fail, and its episodes be dropped. So the hf backend generates
# while holding this lock, and strict_determinism flips the mode only while holding it. On one GPU the two
# share the device's default stream anyway, so the lock costs little overlap there.
STRICT_MODE_LOCK = threading.RLock()


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """``(x * constant) mod 2**32`` for int64 ``x`` in ``[0, 2**32)``, every partial product below 2**49."""
    low, high = x & 0xFFFF, x >> 16
    return (low * constant + ((high * (constant & 0xFFFF)) << 16)) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """``lowbias32``: a bijective 32-bit integer mixer with low bias (int64 tensors holding 32-bit values)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _mix32_int(value: int) -> int:
    """``mix32`` of one Python integer, computed on the CPU (named, so it never lands on a default device)."""
    return int(mix32(torch.tensor([value & MASK32], dtype=torch.int64, device="cpu"))[0])


def seeded_uniforms(seeds: torch.Tensor, step: int) -> torch.Tensor:
    """One float32 uniform in (0, 1) per seed for draw number ``step``: a pure function of ``(seed, step)``."""
    step_key = _mix32_int(step * 0x9E3779B9 + 0x632BE5AB)
    low, high = seeds & MASK32, (seeds >> 32) & MASK32
    bits = mix32(mix32(high ^ step_key) ^ low)
    return ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # 24 bits: exact in float32


def filtered_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """``logits / temperature`` with the tokens outside top-k, then outside the top-p nucleus, set to -inf.

    The nucleus is the smallest set of most likely tokens whose probability reaches ``top_p`` (as
    transformers and vLLM keep it). Rows are independent: ``[B, V]`` in, ``[B, V]`` out.
    """
    scaled = logits.float() / temperature
    if top_k and top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, -float("inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(scaled, dim=-1, descending=True)
        probabilities = torch.softmax(ordered, dim=-1)
        drop_sorted = probabilities.cumsum(dim=-1) - probabilities >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, -float("inf"))
    return scaled


def sample_tokens(
    logits: torch.Tensor,
    seeds: torch.Tensor,
    step: int,
    *,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    logprob_temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of ``logits [B, V]`` from row ``b``'s own stream ``seeds[b]``, and its log-prob.

    Temperature 0 is greedy. The log-prob is ``log_softmax(logits / logprob_temperature)`` at the token,
    before top-k / top-p (see ``rl_llm.agents.llm``), in float32. Both results live on ``logits.device``.
    """
    logits = logits.float()
    if temperature == 0:
        tokens = torch.argmax(logits, dim=-1)
    else:
        probabilities = torch.softmax(filtered_logits(logits, temperature, top_k, top_p), dim=-1)
        cumulative = probabilities.cumsum(dim=-1)
        total = cumulative[:, -1:]
        targets = seeded_uniforms(seeds.to(logits.device), step)[:, None] * total
        # right=True: the first token whose cumulative probability exceeds u, so a zero-probability token
        # (a flat stretch of the cumulative sum) is never drawn. A target rounded up to the total would
        # run off the end: it gets the last token of positive probability (where the sum reaches the total).
        tokens = torch.searchsorted(cumulative, targets, right=True)[:, 0]
        tokens = torch.minimum(tokens, (cumulative < total).sum(dim=-1))
    logprobs = torch.log_softmax(logits / logprob_temperature, dim=-1).gather(1, tokens[:, None])[:, 0]
    return tokens, logprobs
