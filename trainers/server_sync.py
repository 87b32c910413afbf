"""Weight sync to a separate vLLM server: a torch process group between the trainer and the server's workers.

``ServerWeightSync`` (trainer side) and ``WeightReceiver`` (a vLLM worker extension: start the server with
``--worker-extension-cls rl_llm.trainers.server_sync.WeightReceiver`` and ``VLLM_SERVER_DEV_MODE=1``, which
exposes the ``/collective_rpc`` route the trainer drives it through;
``VLLMServer(worker_extension=WEIGHT_RECEIVER)`` does both). ``rl_llm.trainers.generation`` starts or joins
the server of a server-mode run and builds this sync.

- The group: NCCL when the trainer and the server both hold CUDA devices of their own, else gloo over CPU tensors
  (a CPU-only machine, or one GPU shared by both: NCCL refuses two ranks on one device). Same code either way.
- Ranks: the server's workers are ranks ``0..W-1``, the trainer is the LAST rank ``W`` (as TRL does), and the
  trainer hosts the rendezvous store, on a port of its own machine, at an address the server can reach (the
  trainer's address on the route to the server; loopback for a local server).
- The update goes through vLLM's in-place reload route (``Worker.reload_weights``: layerwise reload, which
  re-runs the weight post-processing vLLM did after loading), fed tensor by tensor as they arrive.
- Failures are loud and bounded: every RPC and collective has a timeout, an error on either side raises
  ``WeightSyncError`` in the trainer (the server's workers raise theirs through the RPC's HTTP status), and
  after a failed push the sync refuses further pushes (the group is out of step; the generator's weights are
  stale), instead of hanging or going on silently.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import socket
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from rl_llm.errors import RLLMError
from rl_llm.trainers.sync import WeightSync, merged_weights

if TYPE_CHECKING:
    from rl_llm.agents.llm import LLMPolicy
    from rl_llm.agents.vllm_server import VLLMServerPolicy

#: The worker extension class to pass as ``--worker-extension-cls`` (``VLLMServer(worker_extension=...)``).
WEIGHT_RECEIVER = "rl_llm.trainers.server_sync.WeightReceiver"
_STORE_PREFIX = "rl_llm_weight_sync"
logger = logging.getLogger(__name__)


class WeightSyncError(RLLMError, RuntimeError):
    """A weight transfer to the generator failed; its weights are not the trainer's."""


def group_backend(trainer_device: torch.device, server_on_own_gpu: bool) -> str:
    """``nccl`` for GPU to GPU on distinct devices, else ``gloo`` (CPU tensors)."""
    return "nccl" if trainer_device.type == "cuda" and server_on_own_gpu else "gloo"


def address_towards(host: str) -> str:
    """This machine's address as seen from ``host``: loopback for a local server, else the interface the route
    to ``host`` leaves by (no packet is sent: a UDP ``connect`` only picks the route)."""
    try:
        if ipaddress.ip_address(socket.gethostbyname(host)).is_loopback:
            return "127.0.0.1"
    except (OSError, ValueError):
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        return str(probe.getsockname()[0])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def open_group(store: Any, rank: int, world_size: int, backend: str, timeout: timedelta) -> Any:
    """A torch process group backend (``ProcessGroupGloo`` / ``ProcessGroupNCCL``) on ``store``, outside
    ``torch.distributed``'s global state (the trainer may have its own default group; the server has vLLM's)."""
    prefixed = torch.distributed.PrefixStore(_STORE_PREFIX, store)
    if backend == "gloo":
        gloo = torch.distributed.ProcessGroupGloo
        options = gloo._Options()
        options._timeout = timeout
        # GLOO_SOCKET_IFNAME picks the interface (as in torch.distributed): the default is the hostname's address.
        interface = os.environ.get("GLOO_SOCKET_IFNAME")
        options._devices = [gloo.create_device(interface=interface) if interface else gloo.create_default_device()]
        return gloo(prefixed, rank, world_size, options)
    options = torch.distributed.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return torch.distributed.ProcessGroupNCCL(prefixed, rank, world_size, options)


def broadcast(group: Any, tensor: torch.Tensor, src: int) -> None:
    options = torch.distributed.BroadcastOptions()
    options.rootRank = src
    options.rootTensor = 0
    group.broadcast([tensor], options).wait()


class ServerWeightSync(WeightSync):
    """Pushes the trainer's weights into a vLLM server whose workers carry ``WeightReceiver``."""

    def __init__(
        self,
        policy: LLMPolicy,
        server_url: str,
        device: torch.device,
        *,
        group_port: int = 0,
        trainer_host: str | None = None,
        backend: str | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        super().__init__(policy)
        import httpx

        self.server_url = server_url.rstrip("/").removesuffix("/v1")
        self.device = device
        self.timeout_s = timeout_s
        self.backend = backend or group_backend(device, server_on_own_gpu=False)
        self._broken: str | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-sync-rpc")
        # The RPC's own deadline is the collective's plus a margin, so the server's error arrives first.
        self.client = httpx.Client(base_url=self.server_url, timeout=timeout_s + 30)
        self.store = self.group = None
        try:
            self._join(group_port, trainer_host or address_towards(httpx.URL(self.server_url).host))
        except BaseException:
            self.close()
            raise

    def _join(self, port: int, host: str) -> None:
        server_ranks = int(self._rpc("rl_llm_weight_group_size")[0])  # the route returns non-lists as strings
        self.world_size = server_ranks + 1
        self.rank = server_ranks  # the trainer is the last rank, and the broadcast source
        timeout = timedelta(seconds=self.timeout_s)
        port = port or _free_port()
        # The trainer hosts the rendezvous: the server's workers connect to it (no port is opened on the server).
        self.store = torch.distributed.TCPStore(host, port, self.world_size, is_master=True, timeout=timeout,
                                                wait_for_workers=False)  # fmt: skip
        spec = {"host": host, "port": port, "world_size": self.world_size, "backend": self.backend,
                "timeout_s": self.timeout_s}  # fmt: skip
        joining = self._pool.submit(self._rpc, "rl_llm_join_weight_group", json.dumps(spec))
        try:
            self.group = open_group(self.store, self.rank, self.world_size, self.backend, timeout)
        except BaseException as error:
            raise WeightSyncError(f"the weight group with {self.server_url} did not form: "
                                  f"{_outcome(joining) or error}") from error  # fmt: skip
        self._result(joining, "joining the weight group")

    def _rpc(self, method: str, *args: Any) -> list[Any]:
        """Call ``method`` on every worker of the server (``/collective_rpc``); raises on any worker's error."""
        body = {"method": method, "args": list(args), "timeout": self.timeout_s}
        response = self.client.post("/collective_rpc", json=body)
        if response.status_code == 404:
            raise WeightSyncError(f"{self.server_url} has no /collective_rpc: start it with VLLM_SERVER_DEV_MODE=1 "
                                  f"and --worker-extension-cls {WEIGHT_RECEIVER}")  # fmt: skip
        if response.status_code != 200:
            raise WeightSyncError(f"{method} failed on the server (HTTP {response.status_code}): {response.text[:2000]}")
        return response.json().get("results", []) if response.content else []

    def _result(self, future: Future[Any], what: str) -> Any:
        try:
            return future.result(timeout=self.timeout_s + 60)
        except FutureTimeout:
            raise WeightSyncError(f"{what}: the server did not answer within {self.timeout_s:g}s") from None
        except WeightSyncError:
            raise
        except Exception as error:
            raise WeightSyncError(f"{what}: {type(error).__name__}: {error}") from error

    def push(self, model: nn.Module) -> int:
        if self._broken is not None:
            raise WeightSyncError(f"an earlier weight push failed ({self._broken}); the generator's weights are stale")
        try:
            self._push(model)
        except BaseException as error:
            self._broken = f"{type(error).__name__}: {error}"
            raise
        self.policy.mark_updated()
        return self.policy.policy_version

    @staticmethod
    def describe(weights: list[tuple[str, torch.Tensor]]) -> list[tuple[str, str, list[int]]]:
        """``(name, dtype, shape)`` of each tensor, in sending order: what the server allocates to receive."""
        return [(name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape)) for name, tensor in weights]

    def _push(self, model: nn.Module) -> None:
        send_device = self.device if self.backend == "nccl" else torch.device("cpu")
        with merged_weights(model) as named:
            weights = list(named)
            # First the server checks what is coming (a bad request fails here, before any collective starts);
            # then it receives while this process broadcasts.
            self._rpc("rl_llm_expect_weights", json.dumps(self.describe(weights)))
            receiving = self._pool.submit(self._rpc, "rl_llm_receive_weights")
            try:
                for _, tensor in weights:
                    if receiving.done():  # the server gave up (bad request, load error): do not wait in a collective
                        break
                    broadcast(self.group, tensor.detach().to(send_device).contiguous(), src=self.rank)
            except BaseException as error:
                reason = _outcome(receiving)
                raise WeightSyncError(f"weight broadcast failed: {error}" + (f"; server: {reason}" if reason else "")
                                      ) from error  # fmt: skip
            self._result(receiving, "receiving weights")
        response = self.client.post("/reset_prefix_cache")  # cached prefixes hold keys of the old weights
        if response.status_code != 200:
            raise WeightSyncError(f"/reset_prefix_cache failed (HTTP {response.status_code}): {response.text[:500]}")
        if not prefix_cache_was_reset(response):
            logger.warning("the vLLM server did not reset its prefix cache (requests still hold blocks): "
                           "cached prefixes may keep keys and values of the old weights")  # fmt: skip

    def close(self) -> None:
        if self.group is not None and self._broken is None:
            with contextlib.suppress(Exception):  # the server may already be gone: closing must not fail
                self._rpc("rl_llm_leave_weight_group")
        self.group = self.store = None
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()


def prefix_cache_was_reset(response: Any) -> bool:
    """Whether an HTTP 200 of ``/reset_prefix_cache`` means the cache was reset: vLLM 0.26+ answers
    ``{"success": bool}`` (false while running requests hold blocks); 0.25 an empty body, unchecked."""
    try:
        body = response.json() if response.content else None
    except ValueError:
        return True
    return not isinstance(body, dict) or body.get("success", True) is not False


def _outcome(future: Future[Any]) -> str | None:
    """The error of a finished call, without waiting for an unfinished one."""
    if not future.done():
        return None
    error = future.exception()
    return None if error is None else f"{type(error).__name__}: {error}"


def server_placement(trainer_device: torch.device, gpus: str | None) -> tuple[str | None, bool]:
    """``(CUDA_VISIBLE_DEVICES for a started server or None to inherit, whether it has a GPU of its own)``.

    Not the trainer's devices blindly: with two or more GPUs the server gets the last one the trainer does not
    use; with one it shares the trainer's (bounded by ``gpu_memory_utilization``; weights then go by gloo, as
    NCCL refuses two ranks on one device); on CPU there is nothing to place.
    """
    if gpus is not None:
        return gpus, bool(gpus.strip())
    if trainer_device.type != "cuda" or torch.cuda.device_count() < 2:
        return None, False
    count = torch.cuda.device_count()
    index = count - 1 if (trainer_device.index or 0) != count - 1 else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [part.strip() for part in visible.split(",")] if visible else [str(i) for i in range(count)]
    return ids[index], True


def server_generator(model_path: str | Path, tokenizer: Any, sampling: Any, device: torch.device, config: Any,
                     run_dir: str | Path) -> VLLMServerPolicy:  # fmt: skip
    """Deprecated: moved to ``rl_llm.trainers.generation.server_generator`` (``build_generation`` calls
    it)."""
    warnings.warn("rl_llm.trainers.server_sync.server_generator is deprecated: use "
                  "rl_llm.trainers.generation.build_generation", DeprecationWarning,
                  stacklevel=2)  # fmt: skip
    from rl_llm.trainers.generation import server_generator

    return server_generator(config, model_path, tokenizer, sampling, device, run_dir)


def server_weight_sync(policy: VLLMServerPolicy, device: torch.device,
                       group_port: int = 0) -> ServerWeightSync:  # fmt: skip
    """The sync of a server-mode generator (a ``VLLMServerPolicy``): NCCL where the server has a GPU of its own
    (a server not started here is assumed to), else gloo."""
    server = getattr(policy, "server", None)
    own_gpu = getattr(server, "own_gpu", False) if server is not None else True
    return ServerWeightSync(policy, policy.base_url, device, group_port=group_port,
                            backend=group_backend(device, own_gpu))  # fmt: skip


class WeightReceiver:
    """vLLM worker extension (runs inside the server's workers, where ``self`` is the worker).

    Method names carry an ``rl_llm_`` prefix: vLLM refuses extension methods that shadow the worker's own
    (it has ``update_weights``, ``init_weight_transfer_engine``, ...).
    """

    def rl_llm_weight_group_size(self) -> int:
        from vllm.distributed.parallel_state import get_world_group

        return get_world_group().world_size

    def rl_llm_join_weight_group(self, spec_json: str) -> None:
        from vllm.distributed.parallel_state import get_world_group

        spec = json.loads(spec_json)
        timeout = timedelta(seconds=float(spec["timeout_s"]))
        store = torch.distributed.TCPStore(spec["host"], int(spec["port"]), int(spec["world_size"]), is_master=False,
                                           timeout=timeout)  # fmt: skip
        self._rl_llm_group = open_group(store, get_world_group().rank, int(spec["world_size"]), spec["backend"], timeout)
        self._rl_llm_store = store  # the group reads through it; keep it alive with the group
        self._rl_llm_source = int(spec["world_size"]) - 1
        self._rl_llm_device = self.device if spec["backend"] == "nccl" else torch.device("cpu")

    def rl_llm_expect_weights(self, metadata_json: str) -> None:
        """Check and keep the description of the next transfer (so a bad one fails before any collective)."""
        if getattr(self, "_rl_llm_group", None) is None:
            raise RuntimeError("rl_llm_expect_weights before rl_llm_join_weight_group")
        expected = []
        for entry in json.loads(metadata_json):
            name, dtype_name, shape = entry
            dtype = getattr(torch, str(dtype_name), None)
            if not isinstance(name, str) or not isinstance(dtype, torch.dtype) or \
                    not all(isinstance(size, int) and size >= 0 for size in shape):  # fmt: skip
                raise ValueError(f"bad weight description {entry!r}: expected [name, torch dtype, shape]")
            expected.append((name, dtype, list(shape)))
        self._rl_llm_expected = expected

    def rl_llm_receive_weights(self) -> None:
        group, expected = getattr(self, "_rl_llm_group", None), getattr(self, "_rl_llm_expected", None)
        if group is None or expected is None:
            raise RuntimeError("rl_llm_receive_weights before rl_llm_join_weight_group / rl_llm_expect_weights")
        self._rl_llm_expected = None

        def received() -> Any:
            for name, dtype, shape in expected:
                tensor = torch.empty(shape, dtype=dtype, device=self._rl_llm_device)
                broadcast(group, tensor, src=self._rl_llm_source)
                yield name, tensor

        stream = received()
        try:
            self.reload_weights(weights_iterator=stream, is_checkpoint_format=True)
            for _ in stream:  # a loader that stopped early must not leave the trainer's broadcasts unmatched
                pass
        except BaseException:
            self._rl_llm_group = None  # out of step with the trainer: the trainer must form a new group
            raise

    def rl_llm_leave_weight_group(self) -> None:
        self._rl_llm_group = self._rl_llm_store = None
