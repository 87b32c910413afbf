"""Getting the trainer's new weights to the generator after each update.

- ``SharedModuleSync`` (hf backend): the generator runs on the trainer's own module, so there is nothing to
  copy; the policy version is bumped so new trajectories record which weights produced them.
- ``InProcessSync`` (vLLM engine in the trainer's process, one GPU shared): the engine sleeps during the
  update to free its memory, then wakes and takes the new weights through ``policy.load_weights``.
- ``NcclServerSync`` (a separate ``vllm serve`` process): the trainer and the server's workers form an NCCL
  group; each tensor is broadcast from the trainer while the server receives it through the worker
  extension ``WeightReceiver`` (start the server with ``--worker-extension-cls
  rl_llm.trainers.sync.WeightReceiver`` and ``VLLM_SERVER_DEV_MODE=1`` for its ``/collective_rpc`` route).

LoRA: vLLM gets plain weights, so adapters are merged for the copy and unmerged afterwards.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from rl_llm.trainers.modeling import is_peft


@contextmanager
def merged_weights(model: nn.Module) -> Iterator[Iterator[tuple[str, torch.Tensor]]]:
    """``(name, tensor)`` in the base model's naming, with LoRA adapters merged in for the duration."""
    if not is_peft(model):
        yield ((name, tensor.detach()) for name, tensor in model.state_dict().items())
        return
    model.merge_adapter()
    try:
        base = model.get_base_model()

        def named() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in base.state_dict().items():
                if "lora_" in name:
                    continue
                yield name.replace(".base_layer.", "."), tensor.detach()

        yield named()
    finally:
        model.unmerge_adapter()


class WeightSync:
    """Interface: ``before_rollout`` / ``before_update`` bracket memory sharing; ``push`` sends weights."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def before_rollout(self) -> None:
        """Called before collecting (wake a sleeping generator)."""

    def before_update(self) -> None:
        """Called after collecting, before the optimizer runs (free generator memory)."""

    def push(self, model: nn.Module) -> int:
        """Make the generator use ``model``'s weights; returns the new policy version."""
        raise NotImplementedError

    def close(self) -> None:
        """Release communication resources."""


class SharedModuleSync(WeightSync):
    def push(self, model: nn.Module) -> int:
        self.policy.mark_updated()
        return self.policy.policy_version


class InProcessSync(WeightSync):
    """For a generator holding its own copy of the weights in this process (vLLM ``LLM``)."""

    def __init__(self, policy: Any, sleep: bool = True) -> None:
        super().__init__(policy)
        self.sleep = sleep
        self._asleep = False

    def _wake(self) -> None:
        if self._asleep:
            self.policy.wake_up()
            self._asleep = False

    def before_rollout(self) -> None:
        # A step may end without a push (PPO's critic warm-up): the engine must not generate while asleep.
        self._wake()

    def before_update(self) -> None:
        if self.sleep and not self._asleep:
            self.policy.sleep()
            self._asleep = True

    def push(self, model: nn.Module) -> int:
        self._wake()
        with merged_weights(model) as named:
            self.policy.load_weights(named)
        return self.policy.policy_version


class NcclServerSync(WeightSync):
    """Broadcast weights over NCCL to a vLLM server whose workers carry ``WeightReceiver``."""

    def __init__(self, policy: Any, server_url: str, group_port: int, device: torch.device, timeout_s: float = 600) -> None:
        super().__init__(policy)
        import httpx
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        self.client = httpx.Client(base_url=server_url.rstrip("/"), timeout=timeout_s)
        world = int(self._rpc("server_world_size")[0])  # the route returns results other than lists as strings
        host = httpx.URL(server_url).host
        # The server's workers join as ranks 1..world; this process is rank 0 (the broadcast source).
        joining = threading.Thread(target=self._rpc, args=("init_weight_receiver", host, group_port, 1, world + 1))
        joining.start()
        group = StatelessProcessGroup.create(host=host, port=group_port, rank=0, world_size=world + 1)
        self.communicator = PyNcclCommunicator(group, device=device)
        joining.join()
        self.device = device

    def _rpc(self, method: str, *args: Any) -> list[Any]:
        response = self.client.post("/collective_rpc", json={"method": method, "args": list(args)})
        response.raise_for_status()
        return response.json().get("results", [])

    def push(self, model: nn.Module) -> int:
        with merged_weights(model) as named:
            for name, tensor in named:
                tensor = tensor.to(self.device).contiguous()
                dtype = str(tensor.dtype).removeprefix("torch.")
                receiving = threading.Thread(target=self._rpc, args=("receive_weight", name, dtype, list(tensor.shape)))
                receiving.start()
                self.communicator.broadcast(tensor, src=0, stream=torch.cuda.current_stream())
                receiving.join()
        self.client.post("/reset_prefix_cache").raise_for_status()
        self.policy.mark_updated()
        return self.policy.policy_version

    def close(self) -> None:
        self.client.close()


class WeightReceiver:
    """vLLM worker extension (runs inside the server's GPU workers, where ``self`` is the worker)."""

    def server_world_size(self) -> int:
        from vllm.distributed.parallel_state import get_world_group

        return get_world_group().world_size

    def init_weight_receiver(self, host: str, port: int, rank_offset: int, world_size: int) -> None:
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.parallel_state import get_world_group
        from vllm.distributed.utils import StatelessProcessGroup

        rank = get_world_group().rank + rank_offset
        group = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)
        self._weight_receiver = PyNcclCommunicator(group, device=self.device)

    def receive_weight(self, name: str, dtype: str, shape: list[int]) -> None:
        tensor = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
        self._weight_receiver.broadcast(tensor, src=0, stream=torch.cuda.current_stream())
        self.model_runner.model.load_weights(weights=[(name, tensor)])


def make_weight_sync(policy: Any, backend: str, vllm_mode: str, sleep: bool, server_url: str, group_port: int,
                     device: torch.device) -> WeightSync:
    if backend == "hf":
        return SharedModuleSync(policy)
    if vllm_mode == "colocate":
        return InProcessSync(policy, sleep=sleep)
    return NcclServerSync(policy, server_url, group_port, device)
