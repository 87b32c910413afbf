"""The ``openai`` backend: any OpenAI-compatible chat completions endpoint, for benchmarking hosted models.

``OpenAIPolicy(base_url, model)`` (spec ``openai:URL#MODEL``; the key from ``api_key`` or
``$OPENAI_API_KEY``). It works on chat messages, so its trajectories have messages and turns but no token
ids. The env's system prompt is the first message; its stop strings go in ``stop`` (at most 4, the API's
limit). The API leaves a matched stop string out of the text, so it is put back: from the server's
``stop_reason`` when it reports one (vLLM does), else the closing tag whose opening tag is left open.
Timeouts, HTTP errors and malformed bodies are retried and then raised as ``BackendError`` with the reason
(see ``rl_llm.agents.http_client``); the rollout engine records that error in the trajectory. A reply body over
``max_response_bytes`` (64 MiB by default, decoded) is refused as it arrives, so an endpoint cannot run the
process out of memory.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from rl_llm.agents.aio import run_sync
from rl_llm.agents.http_client import MAX_RESPONSE_BYTES, RetryingJSONClient, require
from rl_llm.agents.llm import GenerationRequest, LLMPolicy, SamplingParams
from rl_llm.agents.policy import Completion
from rl_llm.urls import check_server_url, shown_url

MAX_STOP_STRINGS = 4


class OpenAIPolicy(LLMPolicy):
    name = "openai"
    concurrent = True

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_concurrency: int = 64,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        max_tokens_field: str = "max_tokens",
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(sampling, stop)
        check_server_url("base_url", base_url)
        if not model:
            raise ValueError("a model name is required (spec openai:URL#MODEL)")
        self.model_name = model
        self.name = f"openai:{shown_url(base_url)}#{model}"
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.client = RetryingJSONClient(
            base_url,
            headers={"Authorization": f"Bearer {key}"} if key else {},
            timeout_s=timeout_s,
            max_retries=max_retries,
            backoff_s=backoff_s,
            max_concurrency=max_concurrency,
            max_response_bytes=max_response_bytes,
        )
        self.max_tokens_field = max_tokens_field
        self.extra_body = dict(extra_body or {})

    async def agenerate(self, request: GenerationRequest) -> Completion:
        params = self.sampling
        body: dict[str, Any] = {
            "model": self.model_name,
            "messages": [message.to_dict() for message in request.messages],
            self.max_tokens_field: self.max_new_tokens(request),
            "temperature": params.temperature,
            "top_p": params.top_p,
            "n": 1,
        }
        if request.stop:
            body["stop"] = list(request.stop[:MAX_STOP_STRINGS])
        body.update(self.extra_body)
        return await self.client.post("/chat/completions", body, lambda data: parse_chat_completion(data, request.stop))

    def close(self) -> None:
        run_sync(self.client.aclose())
        super().close()


def parse_chat_completion(data: Any, stops: Sequence[str]) -> Completion:
    require(isinstance(data, dict), f"expected a JSON object, got {type(data).__name__}")
    choices = data.get("choices")
    require(isinstance(choices, list) and bool(choices), "no 'choices' list")
    choice = choices[0]
    require(isinstance(choice, dict) and isinstance(choice.get("message"), dict), "choices[0] has no 'message' object")
    message = choice["message"]
    require("content" in message, "choices[0].message has no 'content'")
    content = message["content"]
    require(content is None or isinstance(content, str), "choices[0].message.content is not a string")
    finish = choice.get("finish_reason")
    # the API's finish_reason is a string or null: anything else was recorded as None, as if not given
    require(finish is None or isinstance(finish, str), f"choices[0].finish_reason {finish!r} is not a string or null")
    # null content is no text at all (a refusal, tool calls, reasoning only): not an empty answer to play, except
    # when the token budget ran out first (finish_reason "length", which the turn records).
    require(content is not None or finish == "length", f"choices[0].message.content is null (finish_reason "
            f"{finish!r}{', refusal: ' + repr(message['refusal']) if message.get('refusal') else ''})")  # fmt: skip
    text = content or ""
    if finish == "stop":
        text = restore_stop(text, stops, choice.get("stop_reason"))
    return Completion(text=text, finish_reason=finish)


def restore_stop(text: str, stops: Sequence[str], stop_reason: Any = None) -> str:
    """Put back the stop string an OpenAI-style API cut off (if the text does not already end with one)."""
    if not stops or any(text.endswith(stop) for stop in stops):
        return text
    if isinstance(stop_reason, str) and stop_reason in stops:
        return text + stop_reason
    best, best_at = None, -1
    for stop in stops:
        if stop.startswith("</") and stop.endswith(">"):
            opening = "<" + stop[2:]
            at = text.rfind(opening)
            if at > best_at and text.find(stop, at) < 0:
                best, best_at = stop, at
    return text + best if best is not None else text
