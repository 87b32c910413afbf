"""The ``hf`` backend: Hugging Face transformers models with batching, on CPU or a GPU.

``HFPolicy(model, tokenizer=None, sampling=..., device=None, dtype="float32", seed=None)`` takes a model
directory, ``"tiny"`` (the locally built tiny model) or an already loaded ``PreTrainedModel``. ``policy.model``
is the module generation runs on: a trainer may pass its own module in and keep training it, calling
``policy.mark_updated()`` after each optimizer step (or use ``load_weights``) so trajectories carry the
right ``policy_version``. ``before_generate``: a callback run at the start of every ``generate`` call, on the
thread that generates, before the model is read (a trainer that generates while it updates swaps new weights
in there: ``rl_llm.trainers.snapshot_sync``); every completion of the call is stamped with the
``policy_version`` read after it (``Completion.policy_version``), so no batch mixes two versions.

Generation is transformers' cached ``generate`` (left-padded batch, KV cache) with the sampling done by this
module's ``RowSampler`` (``rl_llm.agents.sampling``): every request draws from its own random stream, seeded
by ``(policy seed, episode seed, group index, turn)`` (the rollout engine puts the last three in
``request.metadata``) when the policy has a ``seed``. A policy without one draws every seed from the global
torch RNG; a seeded policy's requests without them (no episode seed) take their seed from the policy's own
seeded generator, reproducible in call order. The draw of the whole batch is one vectorised operation on the
model's device; the log-probs are taken from the same logits, in float32 (no second forward pass).

Reproducibility is defined per device (see docs/reproducibility.md):

- ``batch_invariant=True`` (the default on CPU): a request's tokens and log-probs do not depend on the other
  requests in its batch, which follows thread timing (``agents/batching.py``). ``rl_llm.agents.invariant_generation``
  generates in a layout that depends on the request alone where CPU kernels would otherwise change a row's
  last bits (~1e-7, enough to change recorded log-probs and every figure after them): each prompt's prefill
  at its own padded width (the next multiple of ``PAD_MULTIPLE`` above its length), then one decode for all
  rows with a one-query attention whose bits do not depend on the row's position, thread or left padding.
- ``batch_invariant=False`` (the default on CUDA): one call for the whole batch, left-padded to its longest
  prompt. GPU kernels (cuBLAS, SDPA) choose their algorithm by shape, so no layout makes a row independent of
  its batch there; the same config and seed give the same run at the same batch layout on the same machine.

Each row stops at its own eos, its own first stop string or its own token limit. Log-probs are
``log_softmax(logits / T)`` at the sampled token (see ``rl_llm.agents.llm``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LogitsProcessor,
    PreTrainedModel,
    StoppingCriteria,
)

from rl_llm.agents.invariant_generation import (
    PAD_ROWS,
    canonical_width,
    generate_invariant,
    padded_matmuls,
    supports_merged_decode,
    use_batch_invariant_attention,
)
from rl_llm.agents.llm import GenerationRequest, LLMPolicy, SamplingParams, first_stop, named_draw_seed
from rl_llm.agents.policy import Completion
from rl_llm.agents.sampling import STRICT_MODE_LOCK, sample_tokens
from rl_llm.checks import integer

MAX_SEED = 2**64 - 1  # the largest seed torch.Generator.manual_seed takes

# transformers fills every generation setting left unset from the model's own generation_config (Qwen2.5
# Instruct ships repetition_penalty=1.05, others min_p or no_repeat_ngram_size). Pinned here to their no-op
# values, so the scores ``RowSampler`` sees are the model's raw logits.
NEUTRAL_PROCESSORS = dict(
    repetition_penalty=1.0, no_repeat_ngram_size=0, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0
)


class HFPolicy(LLMPolicy):
    name = "hf"

    def __init__(
        self,
        model: str | Path | PreTrainedModel = "tiny",
        tokenizer: Any = None,
        *,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        device: str | torch.device | None = None,
        dtype: str | torch.dtype = "float32",
        seed: int | None = None,
        max_batch_size: int = 64,
        batch_invariant: bool | None = None,
        autocast_dtype: torch.dtype | None = None,
        before_generate: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(sampling, stop)
        # Checked before the model loads: a batch size of 0 or 1.5 failed in range() at the first generate, a
        # negative seed or one past 64 bits inside torch's generator.
        max_batch_size = integer("max_batch_size", max_batch_size, minimum=1)
        seed = None if seed is None else integer("seed", seed, maximum=MAX_SEED)
        if isinstance(dtype, str) and not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"dtype must name a torch dtype such as 'float32' or 'bfloat16', got {dtype!r}")
        if isinstance(model, PreTrainedModel):
            self.model = model
            source = getattr(model, "name_or_path", "") or type(model).__name__
            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(source)
        else:
            from rl_llm.agents.tiny import resolve_model

            source = str(resolve_model(model))
            torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
            self.model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
            self.model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(source)
        self.tokenizer = tokenizer
        self.name = f"hf:{source}"
        self.max_batch_size = max_batch_size
        self.eos_ids = _eos_ids(self.model, tokenizer)
        # Padding is masked out, so any id works; without a pad token an eos id serves (rows end at eos anyway).
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.seed = seed
        # Batch invariance holds on CPU kernels only (module docstring); elsewhere it would cost batching for
        # nothing, so the default follows the device.
        self.batch_invariant = self.device.type == "cpu" if batch_invariant is None else batch_invariant
        # Requests that do not name their draw take their seed from this policy's own generator (never from
        # the global RNG, whose state belongs to the trainer and its checkpoints).
        self._fallback_seeds = torch.Generator().manual_seed(seed) if seed is not None else None
        self._stop_candidates: dict[frozenset[str], torch.Tensor] = {}
        # A mixed-precision trainer's module (float32 weights) generates under the trainer's autocast dtype:
        # at that dtype's speed, with the numerics of its forward passes. None: the weights' own dtype.
        self.autocast_dtype = autocast_dtype
        #: Run at the start of each ``generate`` call, on the generating thread (module docstring).
        self.before_generate = before_generate

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        with STRICT_MODE_LOCK:  # never while a trainer's backward runs strict (agents/sampling.py)
            return self._generate(requests)

    def _generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        if self.before_generate is not None:
            self.before_generate()  # e.g. new weights swapped in: between two batches, never during one
        version = self.policy_version  # the weights this call generates with
        prompts = [self.prompt_ids(request) for request in requests]
        if any(not prompt for prompt in prompts):
            raise ValueError("cannot generate from an empty prompt")
        if not self.batch_invariant:
            return self._generate_layouts(requests, prompts, version)
        use_batch_invariant_attention(self.model)  # one-query attention steps that ignore the batch
        with padded_matmuls(self.model):  # linear layers on at least MIN_MATMUL_ROWS rows, whatever the batch
            return self._generate_layouts(requests, prompts, version)

    def _generate_layouts(self, requests: Sequence[GenerationRequest], prompts: list[list[int]],
                          version: int) -> list[Completion]:  # fmt: skip
        merged = self.batch_invariant and supports_merged_decode(self)
        # One generate call per layout: the canonical width of each prompt (batch-invariant, for models the
        # merged layout cannot take), else one width for every prompt (merged: one decode for all widths).
        layouts: dict[int, list[int]] = {}
        for index, prompt in enumerate(prompts):
            width = canonical_width(len(prompt)) if self.batch_invariant and not merged else 0
            layouts.setdefault(width, []).append(index)
        completions: list[Completion | None] = [None] * len(requests)
        for width, indices in sorted(layouts.items()):
            for start in range(0, len(indices), self.max_batch_size):
                chunk = indices[start : start + self.max_batch_size]
                chunk_requests, chunk_prompts = [requests[i] for i in chunk], [prompts[i] for i in chunk]
                batch = generate_invariant(self, chunk_requests, chunk_prompts) if merged \
                    else self._generate_batch(chunk_requests, chunk_prompts, width)  # fmt: skip
                for index, completion in zip(chunk, batch):
                    completion.policy_version = version
                    completions[index] = completion
        return [completion for completion in completions if completion is not None]

    def greedy_config(self, max_new_tokens: int) -> GenerationConfig:
        """transformers' greedy decoding of the sampler's one-hot scores: its loop and KV cache, our draws."""
        return GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_p=None, top_k=None,
            eos_token_id=sorted(self.eos_ids), pad_token_id=self.pad_id, bos_token_id=None, **NEUTRAL_PROCESSORS,
        )  # fmt: skip

    def _autocast(self) -> Any:
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _generate_batch(self, requests: Sequence[GenerationRequest], prompts: list[list[int]],
                        width: int) -> list[Completion]:  # fmt: skip
        """One cached ``generate`` call, the prompts left-padded to ``width`` (at least the longest prompt)."""
        count = len(requests)
        seeds = [self.request_seed(request) for request in requests]
        limits = [self.max_new_tokens(request) for request in requests]
        stops = [request.stop for request in requests]
        if self.batch_invariant:  # filler rows (a copy of the first, one token long) up to a row multiple
            filler = -count % PAD_ROWS
            prompts, seeds = prompts + prompts[:1] * filler, seeds + seeds[:1] * filler
            limits, stops = limits + [1] * filler, stops + [()] * filler
        input_ids, attention_mask = self._left_pad(prompts, max(width, *(len(p) for p in prompts)))
        prompt_length = input_ids.shape[1]
        criteria = StopStrings(self.tokenizer, prompt_length, stops, limits, self.stop_candidates(stops))
        sampler = RowSampler(self.sampling, torch.tensor(seeds, dtype=torch.int64, device=self.device), prompt_length)
        # Greedy decoding of the sampler's one-hot scores: transformers' loop and KV cache, our draws.
        config = self.greedy_config(max(limits))
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode(), self._autocast():
                sequences = self.model.generate(
                    input_ids=input_ids, attention_mask=attention_mask, generation_config=config,
                    stopping_criteria=[criteria], logits_processor=[sampler],
                )  # fmt: skip
                rows = sequences[:, prompt_length:].tolist()
                row_logprobs = sampler.logprobs().tolist()
        finally:
            self.model.train(was_training)
        return [self._completion(rows[b], row_logprobs[b], criteria.stopped_at[b], limits[b])
                for b in range(count)]  # fmt: skip

    def stop_candidates(self, stops: Sequence[Sequence[str]]) -> torch.Tensor | None:
        """A ``[vocab]`` bool mask on the model's device of the tokens that can end one of ``stops``: those whose
        text holds a stop string's last character, or a partial UTF-8 character (decoded as U+FFFD), or lie
        beyond the tokenizer. None (check every row) when a stop string ends in whitespace, which some
        tokenizers drop when a token is decoded alone. Built once per set of last characters."""
        last = frozenset(s[-1] for row in stops for s in row if s)
        if not last or any(char.isspace() for char in last):
            return None
        if last not in self._stop_candidates:
            known = len(self.tokenizer)
            texts = self.tokenizer.batch_decode([[i] for i in range(known)], skip_special_tokens=True)
            flags = [any(char in text for char in last) or "\ufffd" in text for text in texts]
            size = max(known, int(self.model.get_output_embeddings().weight.shape[0]))
            flags += [True] * (size - known)
            self._stop_candidates[last] = torch.tensor(flags, dtype=torch.bool, device=self.device)
        return self._stop_candidates[last]

    def request_seed(self, request: GenerationRequest) -> int:
        """The seed of this request's random stream: a hash of (policy seed, episode seed, group, turn)."""
        # Without a policy seed every draw is fresh: callers that play one task several times without naming
        # the group member (e.g. TRL repeating a prompt) must not get the same sample each time.
        seed = named_draw_seed(self.seed, request.metadata)
        if seed is None:
            return int(torch.randint(0, 2**62, (1,), generator=self._fallback_seeds).item())
        return seed

    def _left_pad(self, prompts: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = [[self.pad_id] * (width - len(p)) + p for p in prompts]
        mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
        return torch.tensor(ids, device=self.device), torch.tensor(mask, device=self.device)

    def _completion(self, tokens: list[int], logprobs: list[float], stopped_at: int | None, limit: int) -> Completion:
        length = min(limit, len(tokens))
        finish = "length"
        eos_at = next((i + 1 for i, token in enumerate(tokens[:length]) if token in self.eos_ids), None)
        for candidate in (eos_at, stopped_at):
            if candidate is not None and candidate <= length:
                length, finish = candidate, "stop"
        kept = tokens[:length]
        return Completion(self.decode(kept), kept, logprobs[:length], finish)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        parameters = dict(self.model.named_parameters())
        parameters.update(dict(self.model.named_buffers()))
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name not in parameters:
                    raise KeyError(f"load_weights: the model has no parameter {name!r}")
                parameters[name].copy_(tensor)
        self.mark_updated()


class RowSampler(LogitsProcessor):
    """Draws every row's next token from that row's own stream (``sample_tokens``: temperature, top-k, top-p)
    in one vectorised step, records its log-prob, and leaves only that token possible, so greedy decoding
    takes it. Nothing here waits for the device: the log-probs are read once, after generation."""

    def __init__(self, sampling: SamplingParams, seeds: torch.Tensor, prompt_length: int) -> None:
        self.sampling = sampling
        self.seeds = seeds
        self.prompt_length = prompt_length
        self._logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        params = self.sampling
        tokens, logprobs = sample_tokens(
            scores, self.seeds, input_ids.shape[1] - self.prompt_length, temperature=params.temperature,
            top_k=params.top_k, top_p=params.top_p, logprob_temperature=params.logprob_temperature,
        )  # fmt: skip
        self._logprobs.append(logprobs)
        chosen = torch.full_like(scores, -float("inf"))
        return chosen.scatter_(1, tokens[:, None], 0.0)

    def logprobs(self) -> torch.Tensor:
        """``[rows, steps]`` float32 log-probs of the drawn tokens, on the CPU."""
        return torch.stack(self._logprobs, dim=1).cpu()


class StopStrings(StoppingCriteria):
    """Per-row stop strings and token limits for one batched ``generate`` call.

    ``stopped_at[b]`` records how many tokens row ``b`` had generated when its first stop string completed.
    Only a tail window of each row is decoded per step (a stop string of L characters spans at most 4L
    byte-level tokens), so the check costs the same at every step.
    """

    def __init__(self, tokenizer: Any, prompt_length: int, stops: Sequence[Sequence[str]], limits: Sequence[int],
                 candidates: torch.Tensor | None = None, finished: Sequence[bool] | None = None) -> None:  # fmt: skip
        self.tokenizer = tokenizer
        self.prompt_length = prompt_length
        self.stops = [tuple(s for s in row if s) for row in stops]
        self.limits = list(limits)
        self.window = 4 * max((len(s) for row in self.stops for s in row), default=0) + 4
        self.stopped_at: list[int | None] = [None] * len(self.stops)
        # Optional [vocab] mask of the tokens that can complete a stop string (``stop_candidates``): a row whose
        # newest token cannot is not decoded this step, so most steps decode no row at all.
        self.candidates = candidates
        # Rows already over before this call (e.g. an eos as their first token, drawn outside ``generate``).
        self.finished = list(finished) if finished is not None else [False] * len(self.stops)

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        generated = input_ids.shape[1] - self.prompt_length
        done = [over or at is not None or generated >= limit
                for over, at, limit in zip(self.finished, self.stopped_at, self.limits)]  # fmt: skip
        rows = [b for b, row in enumerate(self.stops) if row and not done[b]]
        if rows and self.candidates is not None:
            newest = self.candidates[input_ids[:, -1]].tolist()  # one transfer of B flags for the whole batch
            rows = [b for b in rows if newest[b]]
        if rows:
            start = max(self.prompt_length, input_ids.shape[1] - self.window)
            tails = input_ids[rows, start:].tolist()
            for b, tail in zip(rows, tails):
                if first_stop(self.tokenizer.decode(tail, skip_special_tokens=True), self.stops[b]) >= 0:
                    self.stopped_at[b] = generated
                    done[b] = True
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def _eos_ids(model: PreTrainedModel, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None)
        if value is not None:
            ids.update(value if isinstance(value, list) else [value])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("neither the model nor the tokenizer defines an eos token")
    return frozenset(ids)
