"""A server-mode run's vLLM server, watched: health-checked, restarted with the trainer's weights, within a bound.

``SupervisedServerSync`` is the weight sync of every server-mode run (``trainers/generation.py`` builds it
around ``ServerWeightSync``). It finds the server gone

- before each rollout (``before_rollout``: the process has exited, or ``/health`` fails),
- after a rollout whose episodes ended in errors (``recover``: the caller then collects the step again, so
  the step's data is whole; an evaluation is played again the same way, so no lost episode counts as a loss),
- when a weight push fails (``push``),

and then, for a server the run started itself (slime restarts its engines the same way), restarts it (same
flags, same port when free), joins a new weight group and pushes the trainer's CURRENT weights, so generation
goes on on-policy and the policy version stays the trainer's. At most ``rollout.vllm.max_restarts`` times per
launch of the run (counted from the start or the resume: a resume is the user's word that the cause is fixed;
``vllm/restarts`` counts the whole run's, kept in the checkpoints); past that, or for a server the user runs (``server_url``: never
restarted from here), or in an asynchronous run (its generator thread is using the server), the run stops with
one ``ServerLostError`` line naming the server's log, its last lines and the command that resumes the run
(docs/vllm.md#when-the-server-dies).
"""

from __future__ import annotations

import logging
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from rl_llm.errors import RLLMError
from rl_llm.trainers.server_sync import ServerWeightSync, WeightSyncError, group_backend
from rl_llm.trainers.sync import WeightSync

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rl_llm.agents.vllm_server import VLLMServerPolicy
    from rl_llm.types import Trajectory

logger = logging.getLogger(__name__)


class ServerLostError(RLLMError, RuntimeError):
    """The generation server is gone and the run may not (or can no longer) restart it."""


class SupervisedServerSync(WeightSync):
    """``ServerWeightSync`` to the server of ``policy``, with the health checks and restarts above.

    ``model``: the trainer's module (its current weights are pushed into a restarted server); ``restartable``:
    the run started the server and nothing else is using it while it restarts; ``run_dir``: named in the
    resume command of the final error.
    """

    def __init__(self, policy: VLLMServerPolicy, model: nn.Module, device: torch.device, *, group_port: int,
                 max_restarts: int, restartable: bool, run_dir: str | Path) -> None:  # fmt: skip
        super().__init__(policy)
        self.model, self.device, self.group_port = model, device, group_port
        self.max_restarts, self.restartable, self.run_dir = max_restarts, restartable, Path(run_dir)
        self.restarts = 0  # since this launch (the start or the resume): what max_restarts bounds
        self.earlier_restarts = 0  # before the resume (from the checkpoint): counted in vllm/restarts
        import httpx

        try:
            self.inner = self._join()
        except httpx.HTTPError as error:  # e.g. nothing listens at rollout.vllm.server_url
            raise WeightSyncError(f"cannot reach the vLLM server at {policy.base_url} to form the weight group: "
                                  f"{type(error).__name__}: {_one_line(error)}") from error  # fmt: skip

    def _join(self) -> ServerWeightSync:
        server = self.policy.server
        # NCCL where the server holds a GPU of its own (one the run did not start is assumed to), else gloo.
        own_gpu = server.own_gpu if server is not None else True
        return ServerWeightSync(self.policy, self.policy.base_url, self.device, group_port=self.group_port,
                                backend=group_backend(self.device, own_gpu))  # fmt: skip

    # -- health ---------------------------------------------------------------------------------------------
    def problem(self) -> str | None:
        """Why the server cannot generate now, or None when it is healthy."""
        server = self.policy.server
        if server is not None:
            return server.problem()
        import httpx

        url = self.policy.base_url.removesuffix("/v1")
        try:
            status = httpx.get(f"{url}/health", timeout=10).status_code
        except httpx.HTTPError as error:
            return f"does not answer /health ({type(error).__name__}: {error})"
        return None if status == 200 else f"answers /health with HTTP {status}"

    def before_rollout(self) -> None:
        if (reason := self.problem()) is not None:
            self.restart(reason, new_weights=False)
        self.inner.before_rollout()

    def recover(self, trajectories: Sequence[Trajectory]) -> bool:
        """After a rollout: True when the server was lost during it and has been restarted (collect again)."""
        server = self.policy.server
        exited = server is not None and server.process.poll() is not None
        if not exited and not any(t.error is not None for t in trajectories):
            return False  # a clean rollout: no /health round trip
        if (reason := self.problem()) is None:
            return False  # the errors were the episodes' own
        self.restart(reason, new_weights=False)
        return True

    # -- weights --------------------------------------------------------------------------------------------
    def push(self, model: nn.Module) -> int:
        import httpx

        try:
            return self.inner.push(model)
        except (WeightSyncError, httpx.HTTPError, OSError) as error:  # ConnectError, RemoteProtocolError, ReadError
            if (reason := self.problem()) is None:
                if isinstance(error, WeightSyncError):
                    raise
                raise WeightSyncError(f"the weight push to {self.policy.base_url} failed: "
                                      f"{type(error).__name__}: {_one_line(error)}") from error  # fmt: skip
            self.restart(reason, new_weights=True, model=model, failure=error)
        return self.policy.policy_version

    def restart(self, reason: str, *, new_weights: bool, model: nn.Module | None = None,
                failure: BaseException | None = None) -> None:  # fmt: skip
        """Restart the server and give it the trainer's weights (``model``, else the run's module): the
        published version again (``new_weights=False``), or the next version (a failed push: ``True``)."""
        server = self.policy.server
        if not self.restartable or self.restarts >= self.max_restarts:
            raise ServerLostError(self._final_message(reason)) from failure
        self.restarts += 1
        version = self.policy.policy_version
        logger.warning("the vLLM server %s: restarting it (%d of at most %d, rollout.vllm.max_restarts); log: %s",
                       reason, self.restarts, self.max_restarts, server.log_path)  # fmt: skip
        self.inner._broken = "the server was lost"  # its group died with the server: no goodbye RPC on close
        self.inner.close()
        try:
            self.policy.restart_server(f"{reason} (restart {self.restarts} of at most {self.max_restarts})")
            self.inner = self._join()
            self.inner.push(model if model is not None else self.model)  # the trainer's current weights
        except Exception as error:
            raise ServerLostError(self._final_message(f"{reason}, and restarting it failed "
                                                      f"({type(error).__name__}: {_one_line(error)})")) from error  # fmt: skip
        # The pushed weights are the published version (a health restart) or the next one (a failed push).
        self.policy.mark_updated(version + 1 if new_weights else version)

    def _final_message(self, reason: str) -> str:
        server = self.policy.server
        config = self.run_dir / "config.yaml"
        resume = f"rl-llm train {shlex.quote(str(config))} --out {shlex.quote(str(self.run_dir))}"
        if server is None:
            return (f"the vLLM server at {self.policy.base_url} {reason}; this run did not start it, so it does not "
                    f"restart it: bring it back, then resume from the last checkpoint with: {resume}")  # fmt: skip
        if not self.restartable:
            why = "an asynchronous run does not restart its server (its generator thread is using it)"
        else:
            why = f"rollout.vllm.max_restarts={self.max_restarts} restarts are used up"
        return (f"the vLLM server {reason}; {why}. Its log {server.log_path} ends: {server.log_tail()}. "
                f"Fix the cause, then resume from the last checkpoint with: {resume}")  # fmt: skip

    # -- the rest of a WeightSync ---------------------------------------------------------------------------
    def before_update(self) -> None:
        self.inner.before_update()

    def metrics(self) -> dict[str, float]:
        return {"vllm/restarts": float(self.earlier_restarts + self.restarts)}  # the whole run's, resumes included

    def state_dict(self) -> dict[str, int]:
        return {"restarts": self.earlier_restarts + self.restarts}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.earlier_restarts = int(state.get("restarts", 0))

    def close(self) -> None:
        self.inner.close()


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:2000]
