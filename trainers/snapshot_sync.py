"""Weight sync for asynchronous training with the ``hf`` backend: the generator owns a copy of the policy.

In the synchronous loop the hf generator runs on the trainer's own module (nothing to copy). When generation
runs *during* the update (``rollout.max_staleness`` set), that module changes under the generator's feet, so
the generator gets a copy of its own. ``push`` publishes a snapshot of the trainer's weights (a detached
clone, taken between optimizer steps); the generator loads the newest snapshot on its own thread, right
before its next generation call (``HFPolicy``'s ``before_generate`` hook, which this sync installs), so no
batch ever mixes two versions of the weights. Every completion is stamped with the version that produced it
(``Completion.policy_version``), which the rollout engine records per turn. Built by
``rl_llm.trainers.generation`` for an asynchronous run of the hf backend.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import torch
from torch import nn

from rl_llm.trainers.modeling import is_peft
from rl_llm.trainers.sync import WeightSync

if TYPE_CHECKING:
    from rl_llm.agents.hf import HFPolicy


class SnapshotSync(WeightSync):
    """``push`` publishes; the generator's own thread applies the newest snapshot before generating."""

    policy: HFPolicy

    def __init__(self, policy: HFPolicy) -> None:
        super().__init__(policy)
        self._lock = threading.Lock()
        self._pending: tuple[int, dict[str, torch.Tensor]] | None = None
        self._published: int | None = None  # None: nothing pushed yet, the generator's own version stands
        if policy.before_generate is not None:
            raise ValueError("SnapshotSync: the generator already has a before_generate hook")
        # The rollout engine calls policy.generate on the policy's generation thread, which runs the hook
        # first: the weight swap and the generation calls stay strictly ordered.
        policy.before_generate = self.apply_pending

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

    def close(self) -> None:
        if self.policy.before_generate == self.apply_pending:
            self.policy.before_generate = None
