"""Batch-invariant generation on CPU: a request's tokens and log-probs do not depend on the other requests.

Used by ``HFPolicy`` when ``batch_invariant`` is on (the CPU default; docs/reproducibility.md#the-cpu-layout).
Which requests share a batch follows thread timing (``agents/batching.py``), so a row's bits must come out the
same whichever rows it is batched with, in whatever position. Measured on CPU kernels (torch 2.13, MKL):

- a matmul's bits for a row depend on how many rows it has: MKL picks its kernel by the row count, at
  thresholds that move with the CPU and the inner dimension. On the machine this layout was first measured
  on, every multiple of 4 rows gave the same bits; on another (AVX-512) 4 rows differed from 8, 8 from 12 or
  16, and with 896 or 1,024 inputs 16 to 112 rows from 116 and more, while from 256 rows up (checked to
  8,192, for 32 to 2,048 inputs and up to 32,000 outputs) every count gave the same bits. A row's bits never
  depended on its position or on the other rows. So during generation every linear layer multiplies at
  least ``MIN_MATMUL_ROWS`` rows (``padded_matmuls``: zero rows below that);
- PyTorch's CPU flash attention gives the same bits for every row when the key length is a multiple of 16
  (its per-thread buffers are then aligned; checked for prefill up to 1,024 keys), not at other lengths: a
  row handled by the second thread differs in the last bits from the same row on the first (e.g. the rows in
  positions 4-7 of an 8-row decode step on 2 threads);
- attention written as a matmul, a masked softmax and a matmul gives a row the same bits whatever its
  position, the thread, and any amount of left padding that is a multiple of 16 keys.

Hence the layout, which depends on the request alone except where the kernels above make it not matter:

1. **Prefill per padded width**: each prompt left-padded to the next multiple of ``PAD_MULTIPLE`` strictly
   above its length; the prompts of one width go through the model's body together (matmuls over
   rows x width, flash attention at a key length that is a multiple of 16), and the first token's logits
   come from the output layer applied to the last positions, padded with zero rows to a multiple of
   ``PAD_ROWS`` rows.
2. **One decode for the whole batch**: the KV caches of all widths are left-padded (with masked zeros) to the
   widest, and every row decodes in one cached ``generate`` call, whose one-query attention steps run
   ``batch_invariant_attention`` (matmul + softmax + matmul), the batch filled with copies of a row up to a
   multiple of ``PAD_ROWS`` rows. Straddling two widths therefore costs one decode, not one per width.

Models whose cache is not plain per-layer key/value tensors (sliding-window layers) or whose logits are not the
output layer applied to the last hidden state (soft-capping) decode each width in its own ``generate`` call
instead (``HFPolicy._generate_batch``, its batch filled with copies of a row); a model always takes the same
path (``supports_merged_decode``), so its rows stay batch-invariant either way.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache

try:  # transformers 5's attention and cache interfaces, which this layout plugs into
    from transformers.cache_utils import DynamicLayer
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
except ImportError:  # older transformers: the per-width layout only (supports_merged_decode is False)
    DynamicLayer = None

from rl_llm.agents.llm import GenerationRequest
from rl_llm.agents.policy import Completion
from rl_llm.agents.sampling import sample_tokens

if TYPE_CHECKING:
    from rl_llm.agents.hf import HFPolicy

# Prompts are left-padded to the next multiple of PAD_MULTIPLE tokens; batches hold multiples of PAD_ROWS rows;
# every linear layer multiplies at least MIN_MATMUL_ROWS rows.
PAD_MULTIPLE = 16
PAD_ROWS = 4
MIN_MATMUL_ROWS = 256
ATTENTION = "rl_llm_batch_invariant"


_padding = threading.local()  # per thread: a trainer's forward on another thread keeps its own row counts


@contextmanager
def padded_matmuls(model: torch.nn.Module) -> Iterator[None]:
    """While open on this thread, every ``nn.Linear`` of ``model`` with fewer than ``MIN_MATMUL_ROWS`` input
    rows multiplies that many, zero rows added, so a row's bits do not depend on how many rows its batch has
    (module docstring). The layers' ``forward`` is replaced once, by one that checks this thread's flag: a
    lookup per call, where a torch function mode would put every op of the model through Python."""
    for module in model.modules():
        # nn.Linear's own forward only: a subclass with its own (a quantised layer's) is left as it is
        if type(module).forward is torch.nn.Linear.forward and "forward" not in vars(module):
            module.forward = functools.partial(_linear_forward, module)
    was_active = getattr(_padding, "active", False)
    _padding.active = True
    try:
        yield
    finally:
        _padding.active = was_active


def _linear_forward(module: torch.nn.Linear, inputs: torch.Tensor) -> torch.Tensor:
    if not getattr(_padding, "active", False):
        return F.linear(inputs, module.weight, module.bias)
    rows = inputs.reshape(-1, inputs.shape[-1])
    count = rows.shape[0]
    if count < MIN_MATMUL_ROWS:  # zero rows up to the floor: the kernel MKL picks for 256 rows and more
        rows = torch.cat([rows, rows.new_zeros(MIN_MATMUL_ROWS - count, rows.shape[1])])
    return F.linear(rows, module.weight, module.bias)[:count].reshape(*inputs.shape[:-1], module.weight.shape[0])


def canonical_width(length: int) -> int:
    """The padded width of a prompt of ``length`` tokens (always at least one pad: the mask is never all ones,
    so every call takes the same masked attention path)."""
    return (length // PAD_MULTIPLE + 1) * PAD_MULTIPLE


def batch_invariant_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:  # fmt: skip
    """transformers attention: a decode step (one query per row, inference) as matmul, masked softmax, matmul,
    whose bits for a row do not depend on its batch (module docstring); anything else is transformers' SDPA."""
    special = any(kwargs.get(name) is not None for name in ("position_bias", "cache", "s_aux"))
    if query.shape[2] != 1 or module.training or special:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    scaling = kwargs.get("scaling")
    scores = torch.matmul(query, key.transpose(2, 3)) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
    if attention_mask is not None:
        mask = attention_mask[..., : key.shape[2]]
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), None


def use_batch_invariant_attention(model: Any) -> bool:
    """Switch a model that runs transformers' SDPA to ``batch_invariant_attention`` (training forwards are
    unchanged: they are not one-query steps). False when the model runs another attention."""
    try:
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import sdpa_mask
    except ImportError:  # older transformers: no registered attention functions
        return False
    if DynamicLayer is None:
        return False
    AttentionInterface.register(ATTENTION, batch_invariant_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    current = getattr(model.config, "_attn_implementation", None)
    if current == ATTENTION:
        return True
    if current != "sdpa":
        return False
    try:
        model.set_attn_implementation(ATTENTION)
    except (ValueError, TypeError, AttributeError):  # a model that does not take registered attention functions
        return False
    return True


class _Prefilled:
    """One padded width after its prefill: the rows' tokens so far (prompt + first token), mask, per-layer
    keys and values, and the first token's log-probs."""

    def __init__(self, rows: list[int], width: int, sequences: torch.Tensor, mask: torch.Tensor,
                 layers: list[tuple[torch.Tensor, torch.Tensor]], logprob: torch.Tensor) -> None:  # fmt: skip
        self.rows, self.width, self.sequences, self.mask, self.layers, self.logprob = rows, width, sequences, mask, layers, logprob

    def padded_to(self, width: int) -> tuple[torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Left-padded to ``width``: masked positions, zero keys and values (a masked key adds exactly nothing)."""
        extra = width - self.width
        sequences = F.pad(self.sequences, (extra, 0), value=int(self.sequences[0, -1]))  # any id: masked
        mask = F.pad(self.mask, (extra, 0), value=0)
        layers = [(F.pad(k, (0, 0, extra, 0)), F.pad(v, (0, 0, extra, 0))) for k, v in self.layers]
        return sequences, mask, layers


def supports_merged_decode(policy: HFPolicy) -> bool:
    """The layout needs plain per-layer key/value caches and logits that are the output layer applied to the
    last hidden state (no soft-capping or scaling after it): checked once per model on a probe, bit for bit.
    Other models decode each padded width in its own ``generate`` call (``HFPolicy._generate_batch``)."""
    model = policy.model
    if getattr(model, "_rl_llm_merged_decode", None) is None:
        model._rl_llm_merged_decode = _probe(policy)
    return bool(model._rl_llm_merged_decode)


def _probe(policy: HFPolicy) -> bool:
    model = policy.model
    if DynamicLayer is None or getattr(model.config, "_attn_implementation", None) != ATTENTION:
        return False  # older transformers, or a model on another attention
    was_training = model.training
    try:
        if not all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers):
            return False
        head = model.get_output_embeddings()
        probe = torch.arange(3, 3 + 4 * PAD_MULTIPLE, device=policy.device).reshape(4, PAD_MULTIPLE)
        probe = probe % int(head.weight.shape[0])
        model.eval()
        with torch.inference_mode(), policy._autocast():  # as generation runs (a mixed-precision trainer's)
            logits = model(input_ids=probe, logits_to_keep=1).logits[:, -1]
            hidden = model.get_decoder()(input_ids=probe).last_hidden_state[:, -1]
            return torch.equal(head(hidden), logits)
    except (AttributeError, TypeError, NotImplementedError, ValueError):
        return False
    finally:
        model.train(was_training)


def generate_invariant(policy: HFPolicy, requests: Sequence[GenerationRequest], prompts: list[list[int]]) -> list[Completion]:
    """Generate ``requests`` in the batch-invariant layout (module docstring); completions in request order."""
    seeds = [policy.request_seed(request) for request in requests]
    limits = [policy.max_new_tokens(request) for request in requests]
    stops = [request.stop for request in requests]
    widths: dict[int, list[int]] = {}
    for index, prompt in enumerate(prompts):
        widths.setdefault(canonical_width(len(prompt)), []).append(index)
    was_training = policy.model.training
    policy.model.eval()  # a trainer's module: no dropout, and the one-query steps take the invariant attention
    try:
        with torch.inference_mode(), policy._autocast():
            parts = [_prefill(policy, rows, width, prompts, seeds) for width, rows in sorted(widths.items())]
            results = _decode(policy, parts, seeds, limits, stops)
    finally:
        policy.model.train(was_training)
    return [policy._completion(*results[index], limits[index]) for index in range(len(prompts))]


def cache_keyword(model: torch.nn.Module) -> str:
    """The name the model's ``forward`` (and so its ``generate``) takes a KV cache by: ``cache`` from
    transformers 5.2x on, ``past_key_values`` before (still accepted there with a FutureWarning, until 5.40)."""
    return _cache_keyword_of(type(model))


@functools.cache
def _cache_keyword_of(model_class: type) -> str:
    # Read once per class: the signature is the class's, and reading it costs about 25 us per generate call.
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def _prefill(policy: HFPolicy, rows: list[int], width: int, prompts: list[list[int]], seeds: list[int]) -> _Prefilled:
    """The prompts of one width through the model's body; the first token drawn from the last position's logits."""
    model, params = policy.model, policy.sampling
    input_ids, mask = policy._left_pad([prompts[row] for row in rows], width)
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)  # as transformers' generate numbers them
    cache = DynamicCache(config=model.config)
    decoder = model.get_decoder()
    hidden = decoder(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                     **{cache_keyword(decoder): cache}).last_hidden_state[:, -1]  # fmt: skip
    filler = -len(rows) % PAD_ROWS  # the output layer's matmul: zero rows up to a multiple of PAD_ROWS
    logits = model.get_output_embeddings()(F.pad(hidden, (0, 0, 0, filler)))[: len(rows)].float()
    row_seeds = torch.tensor([seeds[row] for row in rows], dtype=torch.int64, device=logits.device)
    first, logprob = sample_tokens(logits, row_seeds, 0, temperature=params.temperature, top_k=params.top_k,
                                   top_p=params.top_p, logprob_temperature=params.logprob_temperature)  # fmt: skip
    layers = [(layer.keys, layer.values) for layer in cache.layers]
    return _Prefilled(rows, width, torch.cat([input_ids, first[:, None]], dim=1), mask, layers, logprob)


def _decode(policy: HFPolicy, parts: list[_Prefilled], seeds: list[int], limits: list[int],
            stops: list[tuple[str, ...]]) -> dict[int, tuple[list[int], list[float], int | None]]:  # fmt: skip
    """Every row of ``parts`` decoded together from its first token on, in one cached ``generate`` call."""
    from rl_llm.agents.hf import RowSampler, StopStrings

    model = policy.model
    width = max(part.width for part in parts)
    rows = [row for part in parts for row in part.rows]
    padded = [part.padded_to(width) for part in parts]
    sequences, mask = torch.cat([p[0] for p in padded]), torch.cat([p[1] for p in padded])
    layers = [(torch.cat([p[2][i][0] for p in padded]), torch.cat([p[2][i][1] for p in padded]))
              for i in range(len(padded[0][2]))]  # fmt: skip
    first_logprobs = torch.cat([part.logprob for part in parts])
    row_seeds, row_limits, row_stops = [seeds[r] for r in rows], [limits[r] for r in rows], [stops[r] for r in rows]
    filler = -len(rows) % PAD_ROWS  # decode matmuls: copies of the first row, one token long
    if filler:
        def fill(tensor: torch.Tensor) -> torch.Tensor:
            return torch.cat([tensor, tensor[:1].expand(filler, *tensor.shape[1:])])

        sequences, mask, first_logprobs = fill(sequences), fill(mask), fill(first_logprobs)
        layers = [(fill(k), fill(v)) for k, v in layers]
        row_seeds, row_limits, row_stops = row_seeds + row_seeds[:1] * filler, row_limits + [1] * filler, row_stops + [()] * filler
    cache = DynamicCache(config=model.config)
    for index, (keys, values) in enumerate(layers):
        cache.update(keys, values, index)
    mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)  # the first token
    first = sequences[:, -1].tolist()
    criteria = StopStrings(policy.tokenizer, width, row_stops, row_limits, policy.stop_candidates(row_stops),
                           finished=[token in policy.eos_ids for token in first])  # fmt: skip
    done = criteria(sequences, None).tolist()  # the first token may already end a row
    tokens, logprobs = [[token] for token in first], first_logprobs.float().reshape(-1, 1)
    remaining = max(row_limits) - 1
    if remaining > 0 and not all(done[: len(rows)]):
        sampler = RowSampler(policy.sampling, torch.tensor(row_seeds, dtype=torch.int64, device=policy.device), width)
        out = model.generate(input_ids=sequences, attention_mask=mask, **{cache_keyword(model): cache},
                             generation_config=policy.greedy_config(remaining),
                             stopping_criteria=[criteria], logits_processor=[sampler])  # fmt: skip
        tokens = out[:, width:].tolist()
        logprobs = torch.cat([logprobs.cpu(), sampler.logprobs()], dim=1)
    row_logprobs = logprobs.cpu().tolist()
    return {row: (tokens[b], row_logprobs[b], criteria.stopped_at[b]) for b, row in enumerate(rows)}
