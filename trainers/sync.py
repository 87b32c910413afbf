"""Getting the trainer's new weights to the generator after each update.

``WeightSync`` is the seam between the trainer and its generator (an ``LLMPolicy``);
``rl_llm.trainers.generation`` builds the generator and the matching sync together (the one place that reads
the backend and the vLLM mode).

- ``SharedModuleSync`` (hf backend): the generator runs on the trainer's own module, so there is nothing to
  copy; the policy version is bumped so new trajectories record which weights produced them.
- ``InProcessSync`` (vLLM engine in the trainer's process, one GPU shared): the engine sleeps during the
  update to free its memory, then wakes in two stages as vLLM recommends for RL: its weights' memory first,
  the new weights loaded (``policy.load_weights``, vLLM's in-place reload), then its KV cache. Where the
  platform has no sleep mode (CPU) the engine stays awake and only the weights are loaded.
- Server mode (a separate vLLM server process): ``rl_llm.trainers.server_sync``.
- Asynchronous runs of the hf backend (the generator owns a copy): ``rl_llm.trainers.snapshot_sync``.

LoRA: vLLM gets plain weights. The adapters' product is added to each base weight out of place, in float32,
and only the sum is cast to the weight's dtype: the trainer's modules are never written, so the frozen base
cannot drift (merging into bf16 weights in place and unmerging again rounds twice per push).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import nn

from rl_llm.trainers.modeling import is_peft, release_cached_memory

if TYPE_CHECKING:
    from rl_llm.agents.llm import LLMPolicy


@contextmanager
def merged_weights(model: nn.Module) -> Iterator[Iterator[tuple[str, torch.Tensor]]]:
    """``(name, tensor)`` in the base model's naming, with LoRA adapters merged in (out of place)."""
    if not is_peft(model):
        yield ((name, tensor.detach()) for name, tensor in model.state_dict().items())
        return
    base = model.get_base_model()
    owners = {f"{name}.base_layer.weight": module for name, module in base.named_modules() if _is_lora_layer(module)}

    def named() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in base.state_dict().items():
            if "lora_" in name:
                continue
            module = owners.get(name)
            if module is not None:
                tensor = (tensor.detach().float() + lora_delta(module)).to(tensor.dtype)
            yield name.replace(".base_layer.", "."), tensor.detach()

    yield named()


def _is_lora_layer(module: nn.Module) -> bool:
    return hasattr(module, "base_layer") and hasattr(module, "lora_A") and hasattr(module, "scaling")


@torch.no_grad()
def lora_delta(module: nn.Module) -> torch.Tensor:
    """The float32 update ``sum_adapters scaling * B @ A`` that a peft LoRA linear layer adds to its base weight."""
    if getattr(module, "merged", False):
        raise RuntimeError("merged_weights: the LoRA adapters are merged into the base weights already")
    weight = module.base_layer.weight
    delta = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
    for adapter in module.active_adapters:
        if adapter not in module.lora_A:
            if adapter in getattr(module, "lora_embedding_A", {}):
                raise NotImplementedError("merged_weights: LoRA on embeddings is not supported (target linear layers)")
            continue
        if getattr(module, "use_dora", {}).get(adapter, False):
            raise NotImplementedError("merged_weights: DoRA adapters are not supported")
        a, b = module.lora_A[adapter].weight.float(), module.lora_B[adapter].weight.float()
        if a.dim() != 2:
            raise NotImplementedError(f"merged_weights: LoRA on {type(module.base_layer).__name__} is not supported")
        product = (b @ a) * module.scaling[adapter]
        delta += product.T if getattr(module, "fan_in_fan_out", False) else product
    return delta


class WeightSync:
    """How the trainer's weights reach the generator ``policy``.

    ``before_rollout`` / ``before_update`` bracket the generator's use of memory the trainer also needs;
    ``push(model)`` sends ``model``'s weights and returns the policy version they get;
    ``published_version`` is the newest version the trainer has published (the generator's own, except where
    the generator takes pushed weights up later: ``SnapshotSync``); ``close`` releases what the sync holds
    (not the generator).
    """

    policy: LLMPolicy

    def __init__(self, policy: LLMPolicy) -> None:
        self.policy = policy

    @property
    def published_version(self) -> int:
        """The version of the newest weights the trainer has published (what a checkpoint records)."""
        return self.policy.policy_version

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
    """For a generator holding its own copy of the weights in this process (vLLM ``LLM``).

    ``sleep``: free the engine's memory during updates; ignored (the engine stays awake) where the policy says
    it cannot sleep (``policy.can_sleep`` false: vLLM on CPU).
    """

    def __init__(self, policy: LLMPolicy, sleep: bool = True) -> None:
        super().__init__(policy)
        self.sleep = sleep and getattr(policy, "can_sleep", True)
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
        # The update's gradients are dead weight now (the next step zeroes them anyway): free them before the
        # engine takes its memory back.
        model.zero_grad(set_to_none=True)
        release_cached_memory(next(model.parameters()).device)  # the trainer's GPU, not the current one
        if self._asleep:  # split wake-up: weights, load, then the KV cache (never both at the peak)
            self.policy.wake_up(["weights"])
            with merged_weights(model) as named:
                self.policy.load_weights(named)
            self.policy.wake_up(["kv_cache"])
            self._asleep = False
        else:
            with merged_weights(model) as named:
                self.policy.load_weights(named)
        return self.policy.policy_version


def make_weight_sync(policy: LLMPolicy, backend: str, vllm_mode: str, sleep: bool, server_url: str | None,
                     group_port: int, device: torch.device) -> WeightSync:  # fmt: skip
    """Deprecated: ``rl_llm.trainers.generation.build_generation`` builds a run's generator and its sync
    together (``generation.make_weight_sync(policy, config, device)``: the sync alone). ``server_url`` is
    unused: a server-mode sync talks to ``policy.base_url``."""
    warnings.warn("rl_llm.trainers.sync.make_weight_sync is deprecated: use rl_llm.trainers.generation"
                  ".build_generation, or generation.make_weight_sync(policy, config, device)",
                  DeprecationWarning, stacklevel=2)  # fmt: skip
    from rl_llm.trainers import generation
    from rl_llm.trainers.config import TrainConfig

    config = TrainConfig()
    config.rollout.backend, config.rollout.vllm.mode, config.rollout.vllm.sleep = backend, vllm_mode, sleep
    config.rollout.vllm.server_group_port = group_port
    return generation.make_weight_sync(policy, config, device)
