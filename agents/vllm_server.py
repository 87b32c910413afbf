"""An OpenAI-compatible vLLM server: the client ``VLLMServerPolicy`` and the launcher ``VLLMServer``.

Specs: ``vllm:http://HOST:PORT#MODEL`` (a running server), ``vllm-serve:MODEL`` (a server started by rl-llm on
a free local port, stopped on ``close()``).

``VLLMServerPolicy`` speaks vLLM's ``/v1/completions`` with the prompt as token ids,
``return_tokens_as_token_ids`` and ``logprobs``, so it is token-in, token-out; it needs the model's
tokenizer locally (for the chat template). It imports nothing from vLLM. A server returns log-probs at the
sampling temperature only when started with ``--logprobs-mode processed_logprobs`` (``launch`` does that);
for one started otherwise pass ``raw_logprobs=True``. Penalties are sent as their no-op values, so the
server does not apply the defaults of the model's ``generation_config``. The served context window (from
``/v1/models``) becomes ``max_context_tokens``, so the rollout engine ends an episode there (truncated).

``VLLMServer`` runs vLLM's OpenAI-compatible server module (``server_module()``; ``vllm serve`` fails at
start under vLLM's CPU build); on a machine without CUDA it bounds the KV cache (``CPU_KV_CACHE_BYTES``),
since vLLM's memory share there is of host RAM. ``worker_extension`` loads a worker extension into its
workers (a trainer passes its weight receiver, ``rl_llm.trainers.server_sync.WEIGHT_RECEIVER``): this module
imports nothing from the trainer.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from rl_llm.agents.aio import run_sync
from rl_llm.agents.http_client import (
    MAX_RESPONSE_BYTES,
    MalformedResponse,
    ResponseTooLarge,
    RetryingJSONClient,
    client_options,
    get_capped,
    require,
)
from rl_llm.agents.llm import GenerationRequest, LLMPolicy, SamplingParams, named_draw_seed
from rl_llm.agents.policy import Completion
from rl_llm.agents.vllm_backend import _load_tokenizer, engine_arg_names, require_vllm
from rl_llm.checks import integer
from rl_llm.urls import check_server_url, shown_url

logger = logging.getLogger(__name__)

#: The KV cache of a server started on a machine without a GPU (vLLM would otherwise take 90% of host RAM).
CPU_KV_CACHE_BYTES = 1 << 30
#: vLLM's OpenAI-compatible server, newest layout first: ``launchers.api_server.entry`` from vLLM 0.29 on
#: (where ``openai.api_server`` became a deprecated alias of it, to be removed), ``openai.api_server`` before.
SERVER_MODULES = ("vllm.entrypoints.launchers.api_server.entry", "vllm.entrypoints.openai.api_server")
#: What the deprecated ``VLLMServer(weight_sync=True)`` loads: the trainer's weight receiver
#: (``rl_llm.trainers.server_sync.WEIGHT_RECEIVER``), named, not imported (an agent never imports a trainer).
_TRAINER_WEIGHT_RECEIVER = "rl_llm.trainers.server_sync.WeightReceiver"


def server_module() -> str:
    """The server module the installed vLLM has (found, not imported), for ``python -m``."""
    for name in SERVER_MODULES:
        try:
            if importlib.util.find_spec(name) is not None:
                return name
        except ImportError:  # a parent package is missing: an older layout
            continue
    return SERVER_MODULES[-1]


class VLLMServerPolicy(LLMPolicy):
    """Token-in, token-out generation through a vLLM server's ``/v1/completions``.

    ``max_response_bytes``: the most a reply body may be, decoded (see ``RetryingJSONClient``), so a server
    cannot run the process out of memory."""

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
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        raw_logprobs: bool = False,
        server: VLLMServer | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(sampling, stop)
        # Checked first: loading the tokenizer may take a while (the Hub) and the server's /v1/models is asked next.
        self._client_options = client_options(timeout_s=timeout_s, max_retries=max_retries,
                                              max_concurrency=max_concurrency, max_response_bytes=max_response_bytes)
        self.raw_logprobs = raw_logprobs
        # With a seed, requests that name their draw (the rollout engine's) are sent a seed of their own, as the
        # hf backend seeds them (named_draw_seed); without one the server's own sampling stream is used.
        self.seed = None if seed is None else integer("seed", seed)
        self.model_name = model
        check_server_url("base_url", base_url)  # before the tokenizer, which may go to the Hub: a bad URL is said at once
        self.tokenizer = tokenizer if tokenizer is not None else _load_tokenizer(model)
        self.server = server
        self._connect(base_url)

    def _connect(self, base_url: str) -> None:
        base_url = base_url.rstrip("/")
        if not base_url.endswith("/v1"):
            base_url += "/v1"
        self.base_url = base_url
        self.name = f"vllm:{shown_url(base_url)}#{self.model_name}"
        self.client = RetryingJSONClient(base_url, **self._client_options)
        # The served context window bounds each episode (the rollout engine ends it there, as truncated).
        limit = self._client_options["max_response_bytes"]
        context = _served_context_length(base_url, self.model_name, limit)
        if context is not None:
            self.max_context_tokens = context

    def restart_server(self, note: str = "") -> None:
        """Restart the server this client started (``VLLMServer.restart``: same flags, same port when free) and
        talk to it from now on, with fresh connections. Its weights are ``model``'s again: a trainer pushes its
        own after this (``rl_llm.trainers.server_restart``)."""
        if self.server is None:
            raise RuntimeError(f"{self.base_url} was not started by this client: it cannot restart it")
        with contextlib.suppress(Exception):  # the old connections lead to a dead server: drop them
            run_sync(self.client.aclose())
        self.server.restart(note)
        self._connect(self.server.url)

    @classmethod
    def launch(cls, model: str | Path, *, server_args: Sequence[str] = (), server_options: Mapping[str, Any] | None = None,
               **options: Any) -> VLLMServerPolicy:  # fmt: skip
        """Start a vLLM server of ``model`` (``tiny``: the local tiny model) on a free local port and connect to
        it; ``close()`` stops it. ``server_options``: keyword arguments of ``VLLMServer``."""
        from rl_llm.agents.tiny import resolve_model

        model = str(resolve_model(model))
        server = VLLMServer(model, extra_args=server_args, **dict(server_options or {}))
        try:
            return cls(server.url, model, server=server, raw_logprobs=server.raw_logprobs, **options)
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
        if (seed := named_draw_seed(self.seed, request.metadata)) is not None:
            body["seed"] = seed
        return await self.client.post("/completions", body, lambda data: self._parse(data, body["max_tokens"]))

    def _parse(self, data: Any, max_tokens: int | None = None) -> Completion:
        require(isinstance(data, dict) and isinstance(data.get("choices"), list) and data["choices"], "no 'choices'")
        choice = data["choices"][0]
        logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
        require(isinstance(logprobs, dict), "choices[0] has no 'logprobs' object (is this a vLLM server?)")
        tokens, values = logprobs.get("tokens"), logprobs.get("token_logprobs")
        require(isinstance(tokens, list) and isinstance(values, list) and len(tokens) == len(values),
                "logprobs.tokens and logprobs.token_logprobs must be lists of equal length")  # fmt: skip
        token_ids = [_token_id(token) for token in tokens]  # first: not token ids says "not a vLLM server"
        # What the trainer reads must be what was generated (agents/llm.py): a finished generation of 1 to
        # max_tokens tokens, each with a real log-prob. vLLM ends every request with "stop" or "length"; "abort"
        # (or an engine "error") means the tokens are not a whole answer.
        finish = choice.get("finish_reason")
        require(finish in ("stop", "length"), f"finish_reason {finish!r}: the server did not finish the generation")
        limit = len(tokens) if max_tokens is None else max_tokens
        require(0 < len(tokens) <= limit, f"{len(tokens)} tokens for a request of at most {limit}")
        require(all(_is_logprob(value) for value in values), f"token_logprobs are not all finite numbers <= 0: "
                f"{[value for value in values if not _is_logprob(value)][:5]}")  # fmt: skip
        return Completion(self.decode(token_ids), token_ids, [float(v) for v in values], finish)

    def close(self) -> None:
        run_sync(self.client.aclose())
        if self.server is not None:
            self.server.close()
        super().close()


def _served_context_length(base_url: str, model: str, max_response_bytes: int) -> int | None:
    """``max_model_len`` of ``model`` from the server's ``/v1/models`` (vLLM lists it); None when not given (or
    when the list is over ``max_response_bytes``: read whole, it could run the process out of memory)."""
    try:
        response = get_capped(f"{base_url}/models", timeout_s=10, max_response_bytes=max_response_bytes)
        entries = response.json().get("data", []) if response.status_code == 200 else []
    except (httpx.HTTPError, ResponseTooLarge, ValueError, AttributeError):
        return None
    if not isinstance(entries, list):
        return None
    for entry in entries:
        length = entry.get("max_model_len") if isinstance(entry, dict) and entry.get("id") == model else None
        if type(length) is int and length > 0:  # not a bool, not a window no prompt fits
            return length
    return None


_TOKEN_ID = re.compile(r"token_id:(-?[0-9]+)")


def _token_id(token: Any) -> int:
    """The id in vLLM's ``"token_id:N"``. Not held to the tokenizer's vocabulary: a model's embedding often has
    more rows than its tokenizer has ids (Qwen2.5: 151,936 against 151,665), the model may sample one of those,
    and the server's own detokenizer shows it as "" too; the trainer needs the id as sampled."""
    match = _TOKEN_ID.fullmatch(token) if isinstance(token, str) else None
    if match is None:
        raise MalformedResponse(f"expected tokens as 'token_id:N' (return_tokens_as_token_ids), got {token!r}")
    token_id = int(match[1])
    # the tokenizer's decode takes unsigned 32-bit ids (an OverflowError from inside it otherwise)
    require(0 <= token_id < 2**32, f"token id {token_id} is out of range")
    return token_id


#: A log-prob a little above 0 is float rounding in log_softmax; more is not a probability.
_LOGPROB_SLACK = 1e-4


def _is_logprob(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value <= _LOGPROB_SLACK


class VLLMServer:
    """vLLM's OpenAI-compatible server as a subprocess on 127.0.0.1; its log goes to ``log_path``.

    It is started with ``--logprobs-mode processed_logprobs`` where vLLM has that option (0.10.2+), so its
    log-probs follow the sampling temperature; ``raw_logprobs`` says when they do not.

    ``worker_extension``: the dotted path of a vLLM worker extension class (``--worker-extension-cls``), with
    ``VLLM_SERVER_DEV_MODE=1`` for this process only, which exposes the ``/collective_rpc`` route its methods
    are called through. A trainer passes its weight receiver, ``rl_llm.trainers.server_sync.WEIGHT_RECEIVER``,
    to push weights into the server (``weight_sync=True``, deprecated, means that receiver). ``gpus``:
    ``CUDA_VISIBLE_DEVICES`` of the server (None: inherited); ``own_gpu`` says it was given devices of its
    own. ``env``: more environment variables for it.
    """

    def __init__(
        self,
        model: str,
        *,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout_s: float = 900.0,
        log_path: str | Path | None = None,
        worker_extension: str | None = None,
        weight_sync: bool = False,
        gpus: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        vllm = require_vllm()
        extra_args = list(extra_args)
        if "logprobs_mode" in engine_arg_names(vllm) and "--logprobs-mode" not in extra_args:
            extra_args = ["--logprobs-mode", "processed_logprobs", *extra_args]
        environment = dict(os.environ)
        # vLLM refuses requests with more than 4 stop strings by default; rl-llm's envs send up to 5 (ToolCalls-v0).
        environment.setdefault("VLLM_MAX_STOP_STRINGS", "16")
        if weight_sync:
            warnings.warn("VLLMServer(weight_sync=True) is deprecated: pass "
                          "worker_extension=rl_llm.trainers.server_sync.WEIGHT_RECEIVER",
                          DeprecationWarning, stacklevel=2)  # fmt: skip
            worker_extension = worker_extension or _TRAINER_WEIGHT_RECEIVER
        if worker_extension:
            extra_args += ["--worker-extension-cls", worker_extension]
            environment["VLLM_SERVER_DEV_MODE"] = "1"  # the /collective_rpc route the extension is reached by
        if gpus is not None:
            environment["CUDA_VISIBLE_DEVICES"] = gpus
        environment.update(env or {})
        if not _has_cuda() and not {"--kv-cache-memory-bytes", "--gpu-memory-utilization"} & set(extra_args) and \
                not environment.get("VLLM_CPU_KVCACHE_SPACE"):  # fmt: skip
            # On CPU vLLM's memory share is of host RAM (0.9 by default): bound the KV cache instead.
            extra_args += ["--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES)]
        self.own_gpu = bool(gpus and gpus.strip())
        self.raw_logprobs = "processed_logprobs" not in extra_args
        self.model = model
        self.port = port or _free_port()
        self.log_path = Path(log_path or Path.cwd() / f"vllm-server-{self.port}.log")
        # Kept for restart(): the same server again, with the same flags and environment.
        self._extra_args, self._environment, self._startup_timeout_s = extra_args, environment, startup_timeout_s
        self._log = self.log_path.open("w")
        self._start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _start(self) -> None:
        # The OpenAI-compatible server's own module, not the `vllm serve` CLI: the CLI looks up the version of a
        # distribution named `vllm` and fails at start under vLLM's CPU build (distribution `vllm-cpu`).
        command = [sys.executable, "-m", server_module(), "--model", self.model,
                   "--host", "127.0.0.1", "--port", str(self.port), *self._extra_args]  # fmt: skip
        # A session of its own: vLLM's engine-core and worker processes join the server's process group, so a
        # close (or the restart after a crash) stops them too. Killing the API server alone orphans them, each
        # still holding its memory (seen on vLLM's CPU build after a SIGKILL of the server).
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=self._environment,
                                        start_new_session=True)  # fmt: skip
        try:
            self._wait_until_healthy(self._startup_timeout_s)
        except BaseException:
            self.close()
            raise

    def problem(self) -> str | None:
        """Why the server cannot serve (its process exited, or ``/health`` fails), or None when it is healthy."""
        if self.process.poll() is not None:
            return f"exited with code {self.process.returncode}"
        try:
            status = httpx.get(f"{self.url}/health", timeout=10).status_code
        except httpx.HTTPError as error:
            return f"does not answer /health ({type(error).__name__}: {error})"
        return None if status == 200 else f"answers /health with HTTP {status}"

    def restart(self, note: str = "") -> None:
        """Stop what is left of the server and start it again with the same flags: on the same port when that
        is free, else on a new one (``url`` changes; tell the clients). The log goes on in the same file, after
        a line saying why (``note``). Raises as the first start does when it does not become healthy."""
        self.close()
        if not _port_is_free(self.port):
            self.port = _free_port()
        self._log = self.log_path.open("a")
        self._log.write(f"\n===== rl-llm: restarting the vLLM server on port {self.port}{': ' + note if note else ''} =====\n")
        self._log.flush()
        self._start()

    def log_tail(self, lines: int = 15) -> str:
        """The end of the server's log on one line (the last error is what a person needs)."""
        return _log_tail(self.log_path, lines)

    def _wait_until_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the vLLM server exited with code {self.process.returncode} at start: "
                                   f"{_log_tail(self.log_path)}")  # fmt: skip
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise TimeoutError(f"the vLLM server did not become healthy within {timeout_s:g}s; see {self.log_path}")

    def close(self) -> None:
        """Stop the server and every process it started (its process group), also when the server itself has
        already exited: its engine-core and worker processes may have outlived it."""
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        _signal_group(self.process.pid, signal.SIGKILL)  # what is left of the group, after a crash too
        # A killed process is gone only once the kernel has torn down its memory (an engine core's KV cache:
        # a moment); a restarted server that started before that would find the memory still taken.
        _wait_until_gone(self.process.pid, timeout_s=15.0)
        self._log.close()


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``, read from /proc (empty where there is none)."""
    members = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def _wait_until_gone(pgid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (left := _group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if left:
        logger.warning("processes %s of the stopped vLLM server (group %d) are still exiting after %.0fs",
                       left, pgid, timeout_s)  # fmt: skip


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _log_tail(path: Path, lines: int = 15) -> str:
    """The end of a server log, for an error message (the last error is what a person needs)."""
    try:
        tail = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"see {path}"
    return " | ".join(line.strip() for line in tail if line.strip()) + f" (log: {path})"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _port_is_free(port: int) -> bool:
    """Whether a server can listen on ``port`` (with SO_REUSEADDR, as uvicorn binds: a killed server's
    connections in TIME_WAIT do not hold the port)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
