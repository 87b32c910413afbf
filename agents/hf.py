"""The ``hf`` backend: Hugging Face transformers ``generate`` with batching, for CPU and small models.

``HFPolicy(model, tokenizer=None, sampling=..., device=None, dtype="float32")`` takes a model directory,
``"tiny"`` (the locally built tiny model) or an already loaded ``PreTrainedModel``. ``policy.model`` is the
module generation runs on: a trainer may pass its own module in and keep training it, calling
``policy.mark_updated()`` after each optimizer step (or use ``load_weights``) so trajectories carry the
right ``policy_version``.

A batch is left-padded; each row stops at its own eos, its own first stop string or its own token limit.
Log-probs come from the raw logits of each step divided by the temperature (see ``rl_llm.agents.llm``), in
float32, so a forward pass of the same model over the recorded tokens reproduces them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
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
        if seed is not None:
            torch.manual_seed(seed)

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
        input_ids, attention_mask = self._left_pad(prompts)
        prompt_length = input_ids.shape[1]
        criteria = StopStrings(self.tokenizer, prompt_length, [request.stop for request in requests], limits)
        params = self.sampling
        sample = params.temperature > 0
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
                    stopping_criteria=[criteria],
                )  # fmt: skip
                generated = output.sequences[:, prompt_length:]
                logprobs = self._sampled_logprobs(output.logits, generated, params.logprob_temperature)
        finally:
            self.model.train(was_training)
        rows, row_logprobs = generated.tolist(), logprobs.tolist()
        return [
            self._completion(rows[b], row_logprobs[b], criteria.stopped_at[b], limits[b]) for b in range(len(requests))
        ]

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        if any(not prompt for prompt in prompts):
            raise ValueError("cannot generate from an empty prompt")
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
