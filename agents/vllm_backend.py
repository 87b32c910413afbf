"""The ``vllm`` backend: vLLM in process (``VLLMPolicy``; spec ``vllm:MODEL``).

A vLLM server (``vllm:http://HOST:PORT#MODEL``, ``vllm-serve:MODEL``) is ``rl_llm.agents.vllm_server``.

``VLLMPolicy`` uses vLLM's async engine by default (``concurrent = True``: the rollout engine hands it each
request as soon as an env is ready and vLLM batches them continuously); ``async_engine=False`` uses the
offline ``vllm.LLM`` with batched calls. Prompts go in as token ids (``TokensPrompt``) and the completion's
token ids and sampled log-probs come back; log-probs are requested as ``processed_logprobs`` (after the
temperature, and after top-p / top-k when those are set), matching the ``hf`` backend. For a trainer on the
same GPU, ``enable_sleep_mode=True`` allows ``sleep()`` / ``wake_up()`` where the platform has sleep mode
(CUDA, ROCm, XPU; on CPU the engine stays awake, said once in the log, and both are no-ops).

New weights go in through vLLM's supported route for RL trainers, the worker's ``reload_weights`` (layerwise
in-place reload: each layer is loaded in checkpoint format and post-processed as at start-up, so fused and
repacked kernels get the new values). When the engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
it is called on the worker directly, tensors and all; otherwise ``collective_rpc`` carries the weights as
``torch.save`` bytes to the worker extension ``WeightLoader`` (installed as ``worker_extension_cls``), which
calls the same ``reload_weights``. vLLM's own weight-transfer engines (``nccl``, ``ipc``) are CUDA-only; this
route runs on every platform.

vLLM is imported lazily: this module imports without it, and ``require_vllm()`` says clearly when it is
missing (it needs a GPU build, or its CPU build, installed with ``pip install 'rl-llm[vllm]'``).
"""

from __future__ import annotations

import asyncio
import inspect
import io
import logging
import sys
import uuid
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rl_llm.agents.aio import run_sync
from rl_llm.agents.llm import GenerationRequest, LLMPolicy, SamplingParams, named_draw_seed
from rl_llm.agents.policy import Completion

logger = logging.getLogger(__name__)


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
#: Weights shipped to another process go in ``torch.save`` parts of about this many bytes (whole layers each).
WEIGHT_PART_BYTES = 1 << 30
#: The default KV cache on CPU, where ``gpu_memory_utilization`` would be a share of all host RAM.
CPU_KV_CACHE_BYTES = 1 << 30


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
        seeded_draws: bool = False,
        gpu_memory_utilization: float = 0.5,
        enable_sleep_mode: bool = False,
        dtype: str = "auto",
        max_model_len: int | None = None,
        **engine_kwargs: Any,
    ) -> None:
        super().__init__(sampling, stop)
        # seeded_draws: requests that name their draw (the rollout engine's) get a seed of their own from it, as
        # the hf backend seeds them (named_draw_seed): the same draw whatever the batch, where vLLM's logits
        # allow. Off by default: vLLM samples seeded requests one at a time at every decode step.
        self.seed = seed if seeded_draws else None
        vllm = require_vllm()
        self._vllm = vllm
        from rl_llm.agents.tiny import resolve_model

        model = resolve_model(model)
        self.name = f"vllm:{model}"
        self.tokenizer = tokenizer if tokenizer is not None else _load_tokenizer(model)
        from vllm.platforms import current_platform

        # Sleep mode exists on CUDA, ROCm and XPU only; elsewhere vLLM refuses to start with it.
        self.can_sleep = bool(enable_sleep_mode) and current_platform.is_sleep_mode_available()
        if enable_sleep_mode and not self.can_sleep:
            logger.warning("vLLM sleep mode is not available on this platform (%s): the engine stays awake during "
                           "updates and keeps its memory", current_platform.device_name)  # fmt: skip
        options = dict(
            model=str(model), seed=seed, gpu_memory_utilization=gpu_memory_utilization, dtype=dtype,
            enable_sleep_mode=self.can_sleep, max_model_len=max_model_len, **engine_kwargs,
        )  # fmt: skip
        supported = engine_arg_names(vllm)
        if current_platform.is_cpu():
            # On CPU gpu_memory_utilization is a share of host RAM: bound the KV cache instead. Compiling the model
            # takes minutes on a few cores and this build has no Triton: run eagerly unless told otherwise.
            if "kv_cache_memory_bytes" in supported and options.get("kv_cache_memory_bytes") is None:
                options["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
            options.setdefault("enforce_eager", True)
        if "logprobs_mode" in supported:  # vLLM 0.10.2+; before, log-probs ignore the temperature
            options.setdefault("logprobs_mode", "processed_logprobs")
        self.raw_logprobs = options.get("logprobs_mode") != "processed_logprobs"
        if "worker_extension_cls" in supported:
            options.setdefault("worker_extension_cls", WEIGHT_LOADER)
        self._ships_weights = options.get("worker_extension_cls") == WEIGHT_LOADER
        from vllm.sampling_params import RequestOutputKind

        self._final_only = RequestOutputKind.FINAL_ONLY  # one output per request, not one per token
        self.concurrent = async_engine
        with _hide_odd_module_globals():
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
            seed=named_draw_seed(self.seed, request.metadata),
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
        """Replace the engine's weights with ``named_tensors`` (Hugging Face names, every weight of the model)."""
        weights = ((name, tensor.detach()) for name, tensor in named_tensors)
        hf_config = getattr(getattr(self._engine, "model_config", None), "hf_config", None)
        if getattr(hf_config, "tie_word_embeddings", False):
            weights = _with_tied_head(weights)
        worker = self._in_process_worker()
        if worker is not None:
            worker.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        elif not self._ships_weights:
            raise RuntimeError("load_weights: the vLLM engine runs in another process and its worker_extension_cls "
                               f"is not {WEIGHT_LOADER}; set VLLM_ENABLE_V1_MULTIPROCESSING=0 (offline engine) "
                               "or keep the default worker extension")  # fmt: skip
        else:  # vLLM's IPC carries neither functions nor tensors inside call arguments: send bytes
            for part in _serialized_parts(weights):
                self._call("collective_rpc", "reload_serialized_weights", args=(part,))
        self._call("reset_prefix_cache")  # cached prefixes hold the old weights' keys and values
        self.mark_updated()

    def _in_process_worker(self) -> Any:
        """The worker when the engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), else None."""
        engine = self._engine
        # vLLM's in-process client holds the engine core; older versions also alias its executor on the engine.
        executor = getattr(engine, "model_executor", None) or getattr(
            getattr(getattr(engine, "engine_core", None), "engine_core", None), "model_executor", None
        )
        worker = getattr(getattr(executor, "driver_worker", None), "worker", None)
        return worker if callable(getattr(worker, "reload_weights", None)) else None

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        target = self.llm if self.llm is not None else self.engine
        result = getattr(target, method)(*args, **kwargs)
        return run_sync(result) if asyncio.iscoroutine(result) else result

    def sleep(self) -> None:
        """Free the engine's accelerator memory (level 1: weights offloaded to host memory, KV cache dropped)."""
        if self.can_sleep:
            self._call("sleep", 1)

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Reallocate the memory of ``tags`` (``"weights"``, ``"kv_cache"``; None: all) after ``sleep()``."""
        if self.can_sleep:
            self._call("wake_up", list(tags) if tags is not None else None)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
        if self.llm is not None:  # else the offline engine's processes live on until garbage collection
            core = getattr(self.llm.llm_engine, "engine_core", None)
            if core is not None and callable(getattr(core, "shutdown", None)):
                core.shutdown()
        super().close()


def _with_tied_head(weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """The weights, plus ``lm_head.weight`` (the input embedding) at the end when they lack it.

    ``named_parameters()`` of a model with tied embeddings leaves the head out (``state_dict()`` keeps it); vLLM's
    in-place reload then keeps the old head (measured: log-probs off by 0.8 on the tiny model), so it is sent.
    """
    head, embedding = False, None
    for name, tensor in weights:
        head = head or name.endswith("lm_head.weight")
        if name.endswith("embed_tokens.weight"):
            embedding = tensor
        yield name, tensor
    if not head and embedding is not None:
        yield "lm_head.weight", embedding


def _layer_of(name: str) -> str:
    """The transformer block a weight belongs to (``model.layers.3.``), or the weight's own name outside blocks.

    vLLM reloads layer by layer and post-processes a layer once all its weights are in; a block must not be
    split across two ``reload_weights`` calls (q/k/v of one attention go into one fused weight).
    """
    parts = name.split(".")
    for index, part in enumerate(parts[:-1]):
        if part in ("layers", "h", "blocks") and parts[index + 1].isdigit():
            return ".".join(parts[: index + 2])
    return name


def _serialized_parts(weights: Iterable[tuple[str, Any]]) -> Iterator[bytes]:
    """``torch.save`` bytes of ``{name: CPU tensor}`` dicts, cut after about ``WEIGHT_PART_BYTES`` at a block
    boundary, in order."""
    import torch

    def save(part: dict[str, Any]) -> bytes:
        buffer = io.BytesIO()
        torch.save(part, buffer)
        return buffer.getvalue()

    part: dict[str, Any] = {}
    size, layer = 0, None
    for name, tensor in weights:
        if size >= WEIGHT_PART_BYTES and _layer_of(name) != layer:
            yield save(part)
            part, size = {}, 0
        part[name] = tensor.cpu()
        size += tensor.numel() * tensor.element_size()
        layer = _layer_of(name)
    if part:
        yield save(part)


class WeightLoader:
    """vLLM worker extension (``worker_extension_cls``; ``self`` is the worker): weights sent as bytes go through
    the worker's own ``reload_weights`` (vLLM's supported in-place reload)."""

    def reload_serialized_weights(self, payload: bytes) -> None:
        import torch

        weights = torch.load(io.BytesIO(payload), map_location=self.device, weights_only=True)
        self.reload_weights(weights_iterator=iter(weights.items()), is_checkpoint_format=True)


@contextmanager
def _hide_odd_module_globals() -> Iterator[None]:
    """Hide, while an engine starts, module globals whose ``__dict__`` is not a mapping.

    vLLM's CPU platform (0.32) rebinds its kernels by scanning every loaded module's globals and calling
    ``vars(value).get(...)`` on each. Objects that answer any attribute, ``__dict__`` included (llvmlite's
    ``ffi.lib``, loaded whenever numba is), make that scan raise, so an in-process engine could not start in a
    process that had imported numba before. They are put back as soon as the engine is up.
    """
    hidden: list[tuple[dict[str, Any], str, Any]] = []
    with warnings.catch_warnings():  # a deprecated global warns when asked for its __dict__ (torch.distributed's
        warnings.simplefilter("ignore", FutureWarning)  # reduce_op): this read-only look is not a use of it
        warnings.simplefilter("ignore", DeprecationWarning)
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            for name, value in list(namespace.items()):
                try:
                    odd = hasattr(value, "__dict__") and not hasattr(vars(value), "get")  # dicts, mappingproxies: fine
                except Exception:  # an object that cannot even say: leave it to vLLM
                    odd = False
                if odd:
                    hidden.append((namespace, name, namespace.pop(name)))
    try:
        yield
    finally:
        for namespace, name, value in hidden:
            namespace[name] = value
