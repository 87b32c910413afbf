"""Mixed precision for training: float32 master weights, low-precision forward passes (issue #29).

``model.dtype`` names the precision the model computes in, not the precision of the weights being trained:

- ``float32``: no autocast, no loss scaling; exactly the plain loop (``backward``, clip, ``optimizer.step``).
- ``bfloat16`` / ``float16``: as HF Trainer and accelerate do it. The trainable weights, their gradients and the
  optimizer's state are float32 ("master weights"); forward passes run under ``torch.autocast`` in the low
  dtype, so the matmuls (and generation, which shares the module) run at its speed. A LoRA base, frozen and
  shared by the policy and its KL reference, stays in the low dtype (half the memory). Copies of trained
  weights (the KL reference under full fine-tuning, the asynchronous generator's copy) stay float32 and run
  under the same autocast, so they compute exactly what the policy computes (see ``FrozenReference``).
- ``float16`` also scales the loss (``torch.amp.GradScaler``): its narrow range flushes small gradients to 0,
  so the loss is multiplied by a large factor before ``backward``, the gradients are unscaled before clipping,
  a step whose gradients overflowed (inf/nan) is skipped and the scale lowered. bfloat16 has float32's range
  and needs none.

Why the weights themselves are not trained in the low dtype: float16 AdamW breaks at once (its ``eps=1e-8`` is
0 in float16; one step turned most of the tiny model's weights into NaN), and bfloat16 AdamW rounds small
updates away (a weight of 0.02 moves only by steps of about 1e-4): at the default ``lr=1e-6``, five steps
moved 2% of the tiny model's weights at all, against all of them in float32.

One ``Precision`` per optimizer (the policy's, the critic's, the SFT warm start's): each has its own loss
scale, saved in checkpoints (``state_dict``) so a resumed float16 run continues with the same scale.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from rl_llm.trainers.modeling import DTYPES, strict_determinism


class Precision:
    """The autocast context and (float16) loss scaler of one optimizer's loop."""

    def __init__(self, dtype: str = "float32", device: torch.device | str = "cpu") -> None:
        self.dtype = DTYPES[dtype]
        self.device_type = torch.device(device).type
        self.scaler = torch.amp.GradScaler(self.device_type) if self.dtype == torch.float16 else None

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype forward passes run in under autocast; None for float32 (no autocast)."""
        return None if self.dtype == torch.float32 else self.dtype

    def autocast(self) -> AbstractContextManager[Any]:
        """Wrap forward passes (not ``backward``) in this: a no-op for float32."""
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        with strict_determinism():  # a CUDA run's deterministic mode, strict for the backward (its docstring)
            (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def step(self, optimizer: torch.optim.Optimizer, parameters: Iterable[torch.Tensor],
             max_grad_norm: float) -> float | None:  # fmt: skip
        """Clip the accumulated gradients and step: the gradient norm before clipping, or None when the loss
        scaler skipped the step (inf/nan gradients; the parameters and the optimizer's state are untouched)."""
        if self.scaler is None:
            grad_norm = torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm)
            optimizer.step()
            return float(grad_norm)
        self.scaler.unscale_(optimizer)  # true gradients: the clipping threshold is in their units
        grad_norm = torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm)
        scale = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        # The scale drops only when this step found inf/nan, which is exactly when scaler.step skipped it
        # (accelerate detects skipped steps the same way).
        return None if self.scaler.get_scale() < scale else float(grad_norm)

    def stats(self, skipped_steps: int, prefix: str = "") -> dict[str, float]:
        """Figures for the step's log: the loss scale and the steps skipped; none without a scaler."""
        if self.scaler is None:
            return {}
        return {
            f"{prefix}grad_scale": float(self.scaler.get_scale()),
            f"{prefix}skipped_steps": float(skipped_steps),
        }

    def state_dict(self) -> dict[str, Any]:
        return {} if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
