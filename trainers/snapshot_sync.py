"""Weight sync for asynchronous training with the ``hf`` backend: the generator owns a copy of the policy.

In the synchronous loop the hf generator runs on the trainer's own module (nothing to copy). When generation
runs *during* the update (``rollout.max_staleness`` set), that module changes under the generator's feet, so
the generator gets a copy of its own. ``push`` publishes a snapshot of the trainer's weights (a detached
clone, taken between optimizer steps); the generator loads the newest snapshot on its own thread, right
before its next generation call, so no batch ever mixes two versions of the weights. Every completion is
stamped with the version that produced it (``Completion.policy_version``), which the rollout engine records
per turn.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from rl_llm.agents.llm import GenerationRequest
from rl_llm.agents.policy import Completion
from rl_llm.trainers.modeling import is_peft
from rl_llm.trainers.sync import WeightSync


class SnapshotSync(WeightSync):
    """``push`` publishes; the generator's own thread applies the newest snapshot before generating."""

    def __init__(self, policy: Any) -> None:
        super().__init__(policy)
        self._lock = threading.Lock()
        self._pending: tuple[int, dict[str, torch.Tensor]] | None = None
        self._published: int | None = None  # None: nothing pushed yet, the generator's own version stands
        self._generate = policy.generate
        # The rollout engine calls policy.generate on the policy's generation thread; stepping in there keeps
        # the weight swap and the generation calls strictly ordered.
        policy.generate = self._generate_with_newest_weights

    @property
    def published_version(self) -> int:
        return self.policy.policy_version if self._published is None else self._published

    def push(self, model: nn.Module) -> int:
        source = model.get_base_model() if is_peft(model) else model  # the generator copies the base module
        snapshot = {name: tensor.detach().clone() for name, tensor in source.state_dict().items()}
        with self._lock:
            self._published = self.published_version + 1
            self._pending = (self._published, snapshot)
        return self._published

    def apply_pending(self) -> None:
        """Load the newest published snapshot into the generator (call on the generation thread)."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            version, snapshot = pending
            self.policy.model.load_state_dict(snapshot)
            self.policy.mark_updated(version)

    def _generate_with_newest_weights(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        self.apply_pending()
        version = self.policy.policy_version
        completions = self._generate(requests)
        for completion in completions:
            completion.policy_version = version
        return completions

    def close(self) -> None:
        self.policy.generate = self._generate
