"""The ``hf`` backend: Hugging Face transformers models with batching, for CPU and small models.

``HFPolicy(model, tokenizer=None, sampling=..., device=None, dtype="float32", seed=None)`` takes a model
directory, ``"tiny"`` (the locally built tiny model) or an already loaded ``PreTrainedModel``. ``policy.model``
is the module generation runs on: a trainer may pass its own module in and keep training it, calling
``policy.mark_updated()`` after each optimizer step (or use ``load_weights``) so trajectories carry the
right ``policy_version``.

Reproducible, batch-invariant sampling (the default, ``batch_invariant=True``): a run must give the same
tokens and the same recorded log-probs whatever other requests share its batch, and batch composition
depends on thread timing (``agents/batching.py``). So:

- Every request draws from its own ``torch.Generator``, seeded by ``(policy seed, episode seed, group
  index, turn)`` (the rollout engine puts the last three in ``request.metadata``) when the policy has a
  ``seed``. A policy without one draws every seed from the global torch RNG; a seeded policy's requests
  without them (no episode seed) draw from the policy's own seeded generator, reproducible in call order.
- Recorded log-probs come from logits computed in a canonical layout that depends on the request alone:
  each sequence right-padded to the next multiple of ``PAD_MULTIPLE`` strictly above its length, only
  sequences of the same padded width in one forward pass. CPU matmuls
  give identical rows whatever the number of rows, but attention over left padding or over another width
  changes the last bits (~1e-7), enough to change recorded log-probs and every figure computed from them.
- Turns of at most ``max_exact_tokens`` tokens (default 2; the default job writes one) are sampled from
  those canonical logits directly, one full forward per token without a KV cache: exact. Longer turns use
  transformers' cached ``generate`` (left-padded, a KV cache) with each row's token drawn from its own
  generator (``RowSampler``), then the log-probs are recomputed canonically (one teacher-forced forward,
  about the cost of the prompt's prefill). The tokens then come from batched logits that can differ from
  the canonical ones by ~1e-7: a draw changes only if its uniform number falls within that distance of a
  boundary of the cumulative distribution (odds of about 1e-7 per token).

``batch_invariant=False``: transformers' sampling with the global RNG, reproducible only at the same batch
timing (about 30% faster for long turns).

Each row stops at its own eos, its own first stop string or its own token limit. Log-probs are
``log_softmax(logits / T)`` at the sampled token (see ``rl_llm.agents.llm``), in float32, so a forward pass
of the same model over the recorded tokens reproduces them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
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

from rl_llm.agents.llm import GenerationRequest, LLMPolicy, SamplingParams, first_stop
from rl_llm.agents.policy import Completion

# transformers fills every generation setting left unset from the model's own generation_config (Qwen2.5
# Instruct ships repetition_penalty=1.05, others min_p or no_repeat_ngram_size). Pinned here to their no-op
# values, so tokens are drawn from softmax(logits / T) (then top-p / top-k) and the log-probs describe that.
NEUTRAL_PROCESSORS = dict(
    repetition_penalty=1.0, no_repeat_ngram_size=0, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0
)
# Canonical layout of the batch-invariant path: sequences right-padded to the next multiple of this.
PAD_MULTIPLE = 32


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
        batch_invariant: bool = True,
        max_exact_tokens: int = 2,
    ) -> None:
        super().__init__(sampling, stop)
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
        self.batch_invariant = batch_invariant
        self.max_exact_tokens = max_exact_tokens
        # Requests that do not name their draw take their seed from this policy's own generator (never from
        # the global RNG, whose state belongs to the trainer and its checkpoints).
        self._fallback_seeds = torch.Generator().manual_seed(seed) if seed is not None else None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        completions: list[Completion] = []
        for start in range(0, len(requests), self.max_batch_size):
            completions += self._generate_batch(requests[start : start + self.max_batch_size])
        return completions

    def _generate_batch(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        prompts = [self.prompt_ids(request) for request in requests]
        limits = [self.max_new_tokens(request) for request in requests]
        if any(not prompt for prompt in prompts):
            raise ValueError("cannot generate from an empty prompt")
        if self.batch_invariant and max(limits) <= self.max_exact_tokens:
            return self._generate_exact(requests, prompts, limits)
        input_ids, attention_mask = self._left_pad(prompts)
        prompt_length = input_ids.shape[1]
        criteria = StopStrings(self.tokenizer, prompt_length, [request.stop for request in requests], limits)
        params = self.sampling
        # Batch-invariant: each row draws from its own generator (a processor that leaves one token possible,
        # which greedy decoding then takes); the log-probs are recomputed in the canonical layout afterwards.
        invariant = self.batch_invariant
        sample = params.temperature > 0 and not invariant
        processors = [RowSampler(self, [self._generator(request) for request in requests])] if invariant else []
        config = GenerationConfig(
            max_new_tokens=max(limits),
            do_sample=sample,
            temperature=params.temperature if sample else None,
            top_p=params.top_p if sample else None,
            top_k=params.top_k if sample else None,
            min_p=0.0 if sample else None,
            eos_token_id=sorted(self.eos_ids),
            pad_token_id=self.pad_id,
            bos_token_id=None,
            output_logits=True,
            return_dict_in_generate=True,
            **NEUTRAL_PROCESSORS,
        )
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                output = self.model.generate(
                    input_ids=input_ids, attention_mask=attention_mask, generation_config=config,
                    stopping_criteria=[criteria], logits_processor=processors,
                )  # fmt: skip
                generated = output.sequences[:, prompt_length:]
                logprobs = self._sampled_logprobs(output.logits, generated, params.logprob_temperature)
                rows, row_logprobs = generated.tolist(), logprobs.tolist()
                completions = [self._completion(rows[b], row_logprobs[b], criteria.stopped_at[b], limits[b])
                               for b in range(len(requests))]  # fmt: skip
                if invariant:
                    completions = self._canonical_logprobs(prompts, completions)
        finally:
            self.model.train(was_training)
        return completions

    def _canonical_logprobs(self, prompts: list[list[int]], completions: list[Completion]) -> list[Completion]:
        """The completions with their log-probs recomputed in the canonical layout (teacher-forced)."""
        sequences = [prompt + list(c.token_ids or []) for prompt, c in zip(prompts, completions)]
        positions = [list(range(len(p) - 1, len(p) - 1 + len(c.token_ids or []))) for p, c in zip(prompts, completions)]
        logits = self.canonical_logits(sequences, positions)
        temperature = self.sampling.logprob_temperature
        for completion, rows in zip(completions, logits):
            tokens = torch.tensor(completion.token_ids, dtype=torch.long)
            completion.logprobs = torch.log_softmax(rows / temperature, dim=-1).gather(1, tokens[:, None])[:, 0].tolist()
        return completions

    # -- the batch-invariant path ------------------------------------------------------------------------
    def request_seed(self, request: GenerationRequest) -> int:
        """The seed of this request's sampling generator: a hash of (policy seed, episode seed, group, turn)."""
        meta = request.metadata
        # Without a policy seed every draw is fresh: callers that play one task several times without naming
        # the group member (e.g. TRL repeating a prompt) must not get the same sample each time.
        if self.seed is None or meta.get("seed") is None or "turn" not in meta:
            return int(torch.randint(0, 2**62, (1,), generator=self._fallback_seeds).item())
        key = f"{self.seed}/{meta['seed']}/{meta.get('group_index', 0)}/{meta['turn']}"
        return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 2

    def _generator(self, request: GenerationRequest) -> torch.Generator:
        return torch.Generator().manual_seed(self.request_seed(request))

    def _generate_exact(self, requests: Sequence[GenerationRequest], prompts: list[list[int]],
                        limits: list[int]) -> list[Completion]:  # fmt: skip
        generators = [self._generator(request) for request in requests]
        stops = [tuple(s for s in request.stop if s) for request in requests]
        window = 4 * max((len(s) for row in stops for s in row), default=0) + 4
        tokens: list[list[int]] = [[] for _ in requests]
        logprobs: list[list[float]] = [[] for _ in requests]
        stopped_at: list[int | None] = [None] * len(requests)
        active = list(range(len(requests)))
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                while active:
                    logits = self.last_logits([prompts[b] + tokens[b] for b in active])
                    still = []
                    for row, b in enumerate(active):
                        token, logprob = self._sample(logits[row], generators[b])
                        tokens[b].append(token)
                        logprobs[b].append(logprob)
                        if token in self.eos_ids or len(tokens[b]) >= limits[b]:
                            continue
                        if stops[b] and first_stop(self.decode(tokens[b][-window:]), stops[b]) >= 0:
                            stopped_at[b] = len(tokens[b])
                            continue
                        still.append(b)
                    active = still
        finally:
            self.model.train(was_training)
        return [self._completion(tokens[b], logprobs[b], stopped_at[b], limits[b]) for b in range(len(requests))]

    def last_logits(self, sequences: Sequence[list[int]]) -> torch.Tensor:
        """float32 logits ``[len(sequences), vocab]`` at each sequence's last token (canonical layout)."""
        logits = self.canonical_logits(sequences, [[len(sequence) - 1] for sequence in sequences])
        return torch.cat(logits)

    def canonical_logits(self, sequences: Sequence[list[int]], positions: Sequence[list[int]]) -> list[torch.Tensor]:
        """float32 logits ``[len(positions[i]), vocab]`` of each sequence at the given positions, each row computed
        in the canonical layout (see the module docstring), so that it does not depend on the other sequences."""
        buckets: dict[int, list[int]] = {}
        for index, sequence in enumerate(sequences):
            buckets.setdefault((len(sequence) // PAD_MULTIPLE + 1) * PAD_MULTIPLE, []).append(index)
        out: list[torch.Tensor] = [torch.empty(0)] * len(sequences)
        for width, indices in sorted(buckets.items()):
            ids = torch.full((len(indices), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(indices), width), dtype=torch.long)
            for row, index in enumerate(indices):
                ids[row, : len(sequences[index])] = torch.tensor(sequences[index])
                mask[row, : len(sequences[index])] = 1
            # Logits at every position, then the wanted ones picked: projecting only the wanted hidden states
            # would be cheaper, but a one-row matmul (gemv) differs in the last bits between thread counts and
            # from the same row inside a larger matmul.
            logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), use_cache=False).logits
            for row, index in enumerate(indices):
                out[index] = logits[row, positions[index]].float().cpu()
        return out

    def _sample(self, logits: torch.Tensor, generator: torch.Generator) -> tuple[int, float]:
        """One token from softmax(logits / T) after top-k / top-p, and its log-prob before them."""
        params = self.sampling
        logprobs = torch.log_softmax(logits / params.logprob_temperature, dim=-1)
        if params.temperature == 0:
            token = int(torch.argmax(logits))
            return token, float(logprobs[token])
        scaled = logits / params.temperature
        if params.top_k and params.top_k < scaled.numel():
            kth = torch.topk(scaled, params.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, -float("inf"))
        if params.top_p < 1.0:
            ordered, order = torch.sort(scaled, descending=True)
            cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
            drop = cumulative - torch.softmax(ordered, dim=-1) >= params.top_p  # keep the smallest set reaching top_p
            scaled = scaled.scatter(0, order[drop], -float("inf"))
        token = int(torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator))
        return token, float(logprobs[token])

    # -- transformers' cached generate (long generations, batch_invariant=False) -----------------------------
    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(prompt) for prompt in prompts)
        ids = [[self.pad_id] * (width - len(p)) + p for p in prompts]
        mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
        return torch.tensor(ids, device=self.device), torch.tensor(mask, device=self.device)

    @staticmethod
    def _sampled_logprobs(step_logits: Sequence[torch.Tensor], tokens: torch.Tensor, temperature: float) -> torch.Tensor:
        """log_softmax(logits / T) at the sampled token, step by step (one [batch, vocab] tensor at a time)."""
        columns = [
            torch.log_softmax(logits.float() / temperature, dim=-1).gather(1, tokens[:, t : t + 1])
            for t, logits in enumerate(step_logits)
        ]
        return torch.cat(columns, dim=1).cpu()

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
    """Draws each row's next token from that row's own generator (``HFPolicy._sample``: temperature, top-k,
    top-p) and leaves only that token possible, so greedy decoding takes it: rows sample the same whatever the
    batch around them."""

    def __init__(self, policy: HFPolicy, generators: Sequence[torch.Generator]) -> None:
        self.policy = policy
        self.generators = list(generators)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        chosen = torch.full_like(scores, -float("inf"))
        for row, generator in enumerate(self.generators):
            token, _ = self.policy._sample(scores[row].float(), generator)
            chosen[row, token] = 0.0
        return chosen


class StopStrings(StoppingCriteria):
    """Per-row stop strings and token limits for one batched ``generate`` call.

    ``stopped_at[b]`` records how many tokens row ``b`` had generated when its first stop string completed.
    Only a tail window of each row is decoded per step (a stop string of L characters spans at most 4L
    byte-level tokens), so the check costs the same at every step.
    """

    def __init__(self, tokenizer: Any, prompt_length: int, stops: Sequence[Sequence[str]], limits: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.prompt_length = prompt_length
        self.stops = [tuple(s for s in row if s) for row in stops]
        self.limits = list(limits)
        self.window = 4 * max((len(s) for row in self.stops for s in row), default=0) + 4
        self.stopped_at: list[int | None] = [None] * len(self.stops)

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        generated = input_ids.shape[1] - self.prompt_length
        done = [at is not None or generated >= limit for at, limit in zip(self.stopped_at, self.limits)]
        rows = [b for b, row in enumerate(self.stops) if row and not done[b]]
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
