"""What every LLM backend shares: sampling settings, generation requests and the ``LLMPolicy`` base.

Interface (stable; the rollout engine and the trainer build on it):

- ``SamplingParams(max_new_tokens, temperature, top_p, top_k)``: the policy's sampling settings.
- ``GenerationRequest(messages, prompt_ids=None, stop=(), max_new_tokens=None)``: one conversation to
  continue. Token backends continue ``prompt_ids`` exactly when given (token-in, token-out) and otherwise
  render ``messages`` with the chat template; chat backends (``openai``) use ``messages``.
- ``LLMPolicy.generate(requests) -> list[Completion]`` (a synchronous batch) and
  ``await LLMPolicy.agenerate(request) -> Completion`` (one request; backends with their own continuous
  batching set ``concurrent = True`` and the rollout engine then sends each request as soon as it exists).
- ``Completion.token_ids`` are the generated tokens (the stop string and an eos token included when
  generated) and ``Completion.logprobs`` their log-probabilities under the sampling distribution at the
  policy's temperature before top-p/top-k: ``log_softmax(logits / temperature)[token]`` (temperature 0,
  greedy, uses temperature 1). ``Completion.text`` is exactly ``tokenizer.decode(token_ids,
  skip_special_tokens=True)``: generation stops at the first stop string, which stays in the text (a
  final token that runs past the stop string is kept whole, so text and tokens always agree).
- Weights: ``policy_version`` counts updates; ``load_weights(named_tensors)`` copies new weights into the
  generator and bumps it; ``sleep()``/``wake_up()`` free and restore generator memory between rollouts
  (vLLM colocated with a trainer; no-ops elsewhere).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rl_llm.agents.aio import run_sync
from rl_llm.agents.policy import Completion, EpisodeAgent, EpisodeStart, Policy
from rl_llm.checks import integer, real
from rl_llm.types import Message


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k filtering

    def __post_init__(self) -> None:
        # NaN passes every `<` check and reaches the sampler (a NaN temperature makes every probability NaN), a
        # bool or float token count reaches transformers or a server's JSON; numpy numbers become Python ones,
        # which JSON bodies (openai, vllm-serve) can carry.
        checked = {
            "max_new_tokens": integer("max_new_tokens", self.max_new_tokens, minimum=1),
            "temperature": real("temperature", self.temperature, minimum=0.0),  # 0: greedy
            "top_p": real("top_p", self.top_p),
            "top_k": integer("top_k", self.top_k, minimum=0),  # 0: no top-k filtering
        }
        if not 0.0 < checked["top_p"] <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @property
    def logprob_temperature(self) -> float:
        """The temperature log-probs are computed at (greedy decoding reports plain log-probs)."""
        return self.temperature if self.temperature > 0 else 1.0


@dataclass
class GenerationRequest:
    messages: list[Message]
    prompt_ids: list[int] | None = None
    stop: tuple[str, ...] = ()
    max_new_tokens: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def named_draw_seed(policy_seed: int | None, metadata: dict[str, Any]) -> int | None:
    """The 62-bit seed of a request's own random stream: a hash of (policy seed, episode seed, group index,
    turn, seat), the names the rollout engine puts in ``request.metadata``; None when the policy or the request
    names no draw. Every seeded backend (hf, vLLM offline and server) uses it, so a seed group's games draw
    the same whatever their batch (docs/multi-agent.md#backends-and-asynchronous-training)."""
    if policy_seed is None or metadata.get("seed") is None or "turn" not in metadata:
        return None
    key = f"{policy_seed}/{metadata['seed']}/{metadata.get('group_index', 0)}/{metadata['turn']}"
    if metadata.get("seat"):  # a seat of a two-player game: each seat its own stream (agents/rollout.py)
        key += f"/{metadata['seat']}"
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 2


class LLMPolicy(Policy):
    """Base class of the LLM backends. Subclasses implement ``generate`` (and ``agenerate`` if concurrent)."""

    name = "llm"
    #: The Hugging Face tokenizer of token-level backends; None for chat-only backends.
    tokenizer: Any = None
    #: True when the backend batches concurrent requests itself (vLLM engines/servers, HTTP APIs).
    concurrent = False
    #: True when the generator reports log-probs at temperature 1 whatever the sampling temperature (vLLM
    #: before 0.10.2, a vLLM server started without ``--logprobs-mode processed_logprobs``).
    raw_logprobs = False

    def __init__(self, sampling: SamplingParams | None = None, stop: Sequence[str] = ()) -> None:
        self.sampling = sampling or SamplingParams()
        self.stop = tuple(stop)
        self.policy_version = 0
        self._chat_format = None
        self._generation_thread: ThreadPoolExecutor | None = None

    # -- generation ---------------------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """A batch. Concurrent backends get this for free: every request goes through ``agenerate`` at once."""
        if not self.concurrent:
            raise NotImplementedError(f"{type(self).__name__} must implement generate")

        async def all_of() -> list[Completion]:
            return list(await asyncio.gather(*(self.agenerate(request) for request in requests)))

        return run_sync(all_of())

    async def agenerate(self, request: GenerationRequest) -> Completion:
        """One request; the default runs ``generate`` on the generation thread."""
        loop = asyncio.get_running_loop()
        completions = await loop.run_in_executor(self.generation_thread(), self.generate, [request])
        return completions[0]

    @property
    def chat_format(self):  # -> ChatFormat
        """Incremental chat-template tokenisation for this policy's tokenizer (token backends only)."""
        if self.tokenizer is None:
            raise TypeError(f"{type(self).__name__} has no tokenizer: it works on chat messages only")
        if self._chat_format is None:
            from rl_llm.agents.chat import ChatFormat

            self._chat_format = ChatFormat(self.tokenizer)
        return self._chat_format

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        if request.prompt_ids is not None:
            return request.prompt_ids
        return self.chat_format.prompt_ids(request.messages)

    def generation_thread(self) -> ThreadPoolExecutor:
        """The one thread batch generation runs on, kept for the policy's lifetime.

        A fresh thread per rollout would also mean fresh per-thread state in the math libraries (OpenMP
        thread teams, CUDA streams) on every call; one long-lived thread keeps that warm.
        """
        if self._generation_thread is None:
            self._generation_thread = ThreadPoolExecutor(1, thread_name_prefix=f"rl-llm-generate-{self.name}")
        return self._generation_thread

    def max_new_tokens(self, request: GenerationRequest) -> int:
        return request.max_new_tokens or self.sampling.max_new_tokens

    @property
    def logprob_temperature(self) -> float:
        """The temperature ``Completion.logprobs`` were computed at."""
        return 1.0 if self.raw_logprobs else self.sampling.logprob_temperature

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    # -- the Policy interface -----------------------------------------------------------------------------
    def start_episode(self, episode: EpisodeStart) -> LLMEpisode:
        """An agent for code outside the rollout engine (the engine itself sends generation requests, batched
        and token-in, token-out): each turn one request, with the env's stop strings."""
        return LLMEpisode(self, episode.stop or self.stop)

    def act(self, conversations: Sequence[Sequence[Message]]) -> list[Completion]:
        requests = [GenerationRequest(messages=list(conversation), stop=self.stop) for conversation in conversations]
        return self.generate(requests)

    def close(self) -> None:
        executor, self._generation_thread = self._generation_thread, None
        if executor is not None:
            executor.shutdown(wait=True)  # a generation still running finishes first; then the thread is gone

    # -- weights ------------------------------------------------------------------------------------------
    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot load weights")

    def mark_updated(self, version: int | None = None) -> None:
        """Record that the generator's weights changed (in place, e.g. a shared module after a step)."""
        self.policy_version = self.policy_version + 1 if version is None else version

    def sleep(self) -> None:
        """Free generator memory while the trainer runs (vLLM sleep mode); a no-op elsewhere."""

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Undo ``sleep``; ``tags`` (vLLM: ``["weights"]``, then ``["kv_cache"]``) wakes a part at a time."""


class LLMEpisode(EpisodeAgent):
    """One episode of an LLM policy outside the engine: the conversation re-rendered each turn (no token record)."""

    def __init__(self, policy: LLMPolicy, stop: Sequence[str] = ()) -> None:
        self.policy = policy
        self.stop = tuple(stop)

    def request(self, conversation: Sequence[Message]) -> GenerationRequest:
        return GenerationRequest(messages=list(conversation), stop=self.stop)

    def act(self, conversation: Sequence[Message]) -> Completion:
        return self.policy.generate([self.request(conversation)])[0]

    async def aact(self, conversation: Sequence[Message]) -> Completion:
        return await self.policy.agenerate(self.request(conversation))


def first_stop(text: str, stops: Sequence[str]) -> int:
    """End index of the earliest stop string in ``text`` (-1 if none)."""
    best = -1
    for stop in stops:
        index = text.find(stop)
        if index >= 0 and (best < 0 or index + len(stop) < best):
            best = index + len(stop)
    return best
