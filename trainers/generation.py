"""Which generator a training run gets, and how the trainer's weights reach it: one door.

This is the only module that reads ``rollout.backend``, ``rollout.vllm.mode`` and whether the run is
asynchronous (``rollout.max_staleness`` set). ``build_generation(...)`` returns the generator (an
``LLMPolicy``) together with its weight sync (a ``WeightSync``); ``check_generation_config(config)``, called
by ``TrainConfig.validate``, refuses the combinations that cannot run. (TRL's ``VLLMGeneration`` and verl's
``(backend, mode)`` rollout registry make the same choice in one place.)

- ``hf``, synchronous: ``HFPolicy`` on the trainer's own module; ``SharedModuleSync`` (nothing to copy).
- ``hf``, asynchronous: ``HFPolicy`` on a copy of that module; ``SnapshotSync`` (snapshots swapped in on the
  generation thread between two batches).
- ``vllm``, ``colocate``, synchronous: ``VLLMPolicy``, the engine in this process; ``InProcessSync``
  (``load_weights``, sleep and wake around the update).
- ``vllm``, ``colocate``, asynchronous: refused (an in-process engine cannot take weights while it generates).
- ``vllm``, ``server``, either: ``VLLMServerPolicy``, a client of ``rollout.vllm.server_url`` or of a server
  started here whose workers carry ``WeightReceiver``; ``ServerWeightSync`` (a torch process group), inside
  ``SupervisedServerSync`` (``server_restart.py``: health checks, and restarts of a server started here).

Heavy imports (torch, transformers, vLLM) happen inside the builders, so ``TrainConfig.validate`` can call the
check without loading them.
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from rl_llm.trainers.config import ConfigError
from rl_llm.urls import check_server_url

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import torch
    from torch import nn

    from rl_llm.agents.llm import LLMPolicy, SamplingParams
    from rl_llm.agents.vllm_server import VLLMServerPolicy
    from rl_llm.trainers.config import TrainConfig
    from rl_llm.trainers.precision import Precision
    from rl_llm.trainers.sync import WeightSync
    from rl_llm.types import Trajectory

BACKENDS = ("hf", "vllm")
VLLM_MODES = ("colocate", "server")


# CUDA_VISIBLE_DEVICES as a server's GPUs: indices or GPU-/MIG- UUIDs, comma-separated; empty for none.
GPU_LIST = re.compile(r"\s*|\s*(\d+|(GPU|MIG)-[\w/-]+)(\s*,\s*(\d+|(GPU|MIG)-[\w/-]+))*\s*")


def check_generation_config(config: TrainConfig) -> None:
    """Raise ``ConfigError`` for a backend, vLLM mode or backend x mode x asynchronous combination that
    cannot run."""
    rollout = config.rollout
    if rollout.backend not in BACKENDS:
        raise ConfigError(f"rollout.backend: {rollout.backend!r} is not one of {list(BACKENDS)}")
    if rollout.vllm.mode not in VLLM_MODES:
        raise ConfigError(f"rollout.vllm.mode: {rollout.vllm.mode!r} is not one of {list(VLLM_MODES)}")
    restarts = rollout.vllm.max_restarts
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
        raise ConfigError(f"rollout.vllm.max_restarts must be an integer >= 0 (0: never restart), got {restarts!r}")
    if rollout.vllm.server_url is not None:  # else refused at the first request, after the model had loaded
        try:
            check_server_url("rollout.vllm.server_url", rollout.vllm.server_url)
        except ValueError as error:
            raise ConfigError(str(error)) from None
    gpus = rollout.vllm.server_gpus
    if gpus is not None and not GPU_LIST.fullmatch(gpus):  # CUDA_VISIBLE_DEVICES=abc: a server with no GPU
        raise ConfigError(f"rollout.vllm.server_gpus must be CUDA_VISIBLE_DEVICES for the server (GPU indices or "
                          f"UUIDs, comma-separated, such as 1 or 2,3; empty: none), got {gpus!r}")  # fmt: skip
    if is_asynchronous(config) and rollout.backend == "vllm" and rollout.vllm.mode == "colocate":
        raise ConfigError("asynchronous training (rollout.max_staleness) with vLLM needs rollout.vllm.mode=server: "
                          "an in-process engine cannot take new weights while it generates")  # fmt: skip


def is_asynchronous(config: TrainConfig) -> bool:
    """Whether generation overlaps the update (``trainers/async_grpo.py``)."""
    return config.rollout.max_staleness is not None


Played = TypeVar("Played")


def play_whole(play: Callable[[], Played], recover: Callable[[Sequence[Trajectory]], bool] | None,
               episodes: Callable[[Played], Sequence[Trajectory]] | None = None) -> Played:
    """``play()``, and again for as long as ``recover`` (a run's ``Generation.recover``) says the generator was
    lost during it and has been restarted: a lost episode is not the policy's result, so what is returned was
    played whole by one server. ``episodes`` picks the trajectories out of what ``play`` returns where that is
    not a list of them (a game's matches: both seats). Bounded, since ``recover`` raises past
    ``rollout.vllm.max_restarts`` (docs/vllm.md#when-the-server-dies); ``recover=None`` plays once."""
    played = play()
    while recover is not None and recover(episodes(played) if episodes is not None else played):  # type: ignore[arg-type]
        played = play()
    return played


@dataclass
class Generation:
    """A run's generator and the weight sync that feeds it the trainer's weights.

    ``loads_own_weights``: the generator read ``model.path`` itself (vLLM), so the trainer's weights reach it
    only through ``sync.push``; the hf generator starts from the trainer's module (shared, or a copy of it).
    """

    policy: LLMPolicy
    sync: WeightSync
    loads_own_weights: bool = False

    def catch_up(self, model: nn.Module, version: int | None = None) -> None:
        """Give the generator ``model``'s weights where they are not the ones it started from (a resumed or
        warm-started run), and, for a resumed run, the policy version they carry."""
        if self.loads_own_weights:
            self.sync.push(model)
        if version is not None:
            self.policy.mark_updated(version)

    def recover(self, trajectories: Sequence[Trajectory]) -> bool:
        """After a rollout: True when the generator (a vLLM server) was lost during it and has been restarted
        with the trainer's weights, so the caller collects again (docs/vllm.md#when-the-server-dies)."""
        recover = getattr(self.sync, "recover", None)
        return bool(recover(trajectories)) if recover is not None else False

    def metrics(self) -> dict[str, float]:
        """The generator's own figures for a step's metrics (``vllm/restarts`` in server mode)."""
        metrics = getattr(self.sync, "metrics", None)
        return metrics() if metrics is not None else {}

    def state_dict(self) -> dict[str, int]:
        """What a checkpoint keeps of the generator (server mode: the run's restarts so far)."""
        state = getattr(self.sync, "state_dict", None)
        return state() if state is not None else {}

    def load_state_dict(self, state: dict[str, int]) -> None:
        load = getattr(self.sync, "load_state_dict", None)
        if load is not None:
            load(state)

    def close(self) -> None:
        """Release the weight sync, then the generator (which stops a server started for it)."""
        try:
            self.sync.close()
        finally:
            self.policy.close()


def build_generation(config: TrainConfig, model: nn.Module, tokenizer: object, model_path: str | Path,
                     device: torch.device, run_dir: str | Path, precision: Precision) -> Generation:  # fmt: skip
    """The generator of ``config`` and its weight sync. ``model``: the trainer's module (the hf generator
    runs on it, or on a copy of it when asynchronous); ``model_path``: the weights a vLLM engine loads;
    ``precision``: the trainer's (the hf generator runs under the same autocast); ``run_dir``: where a server
    started for the run writes its log."""
    check_generation_config(config)
    policy = build_generator(config, model, tokenizer, model_path, device, run_dir, precision)
    try:
        sync = make_weight_sync(policy, config, device, model=model, run_dir=run_dir)
    except BaseException:
        policy.close()  # the generator may be a server process: stop it
        raise
    return Generation(policy, sync, loads_own_weights=config.rollout.backend == "vllm")


def build_generator(config: TrainConfig, model: nn.Module, tokenizer: object, model_path: str | Path,
                    device: torch.device, run_dir: str | Path, precision: Precision) -> LLMPolicy:  # fmt: skip
    """The rollout policy of ``config`` (see the table in the module docstring)."""
    from rl_llm.agents.llm import SamplingParams

    rollout = config.rollout
    sampling = SamplingParams(rollout.max_new_tokens, rollout.temperature, rollout.top_p)
    if rollout.backend == "hf":
        from rl_llm.agents.hf import HFPolicy
        from rl_llm.trainers.modeling import is_peft

        # Share the trainer's module (the LoRA-injected base model under peft): no copy, no sync traffic.
        module = model.get_base_model() if is_peft(model) else model
        if is_asynchronous(config):
            # Asynchronous training generates while the trainer updates: the generator needs its own copy
            # (in the trainer's dtype, under the same autocast: the same numerics as the trainer's passes).
            # Its requires_grad flags stay the trainer's: on CPU, transformers' forward over frozen weights
            # gives other last bits than over trainable ones (even in inference mode), and a zero-staleness
            # asynchronous run must reproduce the synchronous one. Nothing trains the copy either way.
            module = copy.deepcopy(module)
        # Generation under the trainer's autocast: the same numerics as the update's forward passes.
        return HFPolicy(module, tokenizer, sampling=sampling, max_batch_size=rollout.concurrency, seed=config.seed,
                        autocast_dtype=precision.autocast_dtype)  # fmt: skip
    vllm = rollout.vllm
    if vllm.mode == "colocate":
        from rl_llm.agents.vllm_backend import VLLMPolicy

        # The engine in this process: new weights are copied straight into its model, GPU to GPU.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        return VLLMPolicy(
            model_path, tokenizer=tokenizer, sampling=sampling, async_engine=False, seed=config.seed,
            seeded_draws=vllm.seeded_draws,
            gpu_memory_utilization=vllm.gpu_memory_utilization, enable_sleep_mode=vllm.sleep,
            max_model_len=vllm.max_model_len, dtype=config.model.dtype,
        )  # fmt: skip
    # A vLLM server: the one at rollout.vllm.server_url, or one started here (placed off the trainer's GPU).
    return server_generator(config, model_path, tokenizer, sampling, device, run_dir)


def make_weight_sync(policy: LLMPolicy, config: TrainConfig, device: torch.device, *, model: nn.Module | None = None,
                     run_dir: str | Path | None = None) -> WeightSync:  # fmt: skip
    """The weight sync of ``policy``, the generator ``build_generator`` made for ``config``. In server mode,
    given the trainer's ``model`` and the ``run_dir``, the sync also health-checks the server and restarts one
    the run started (``trainers/server_restart.py``)."""
    rollout = config.rollout
    if rollout.backend == "hf":
        if is_asynchronous(config):
            from rl_llm.trainers.snapshot_sync import SnapshotSync

            return SnapshotSync(policy)  # the asynchronous hf generator owns a copy
        from rl_llm.trainers.sync import SharedModuleSync

        return SharedModuleSync(policy)
    if rollout.vllm.mode == "colocate":
        from rl_llm.trainers.sync import InProcessSync

        return InProcessSync(policy, sleep=rollout.vllm.sleep)
    # The server the generator talks to (the one the run started, or rollout.vllm.server_url): policy.base_url.
    if model is None or run_dir is None:
        from rl_llm.trainers.server_sync import server_weight_sync

        return server_weight_sync(policy, device, rollout.vllm.server_group_port)
    from rl_llm.trainers.server_restart import SupervisedServerSync

    # Restarted only when this run started it, and never under an asynchronous run's generator thread.
    restartable = getattr(policy, "server", None) is not None and not is_asynchronous(config)
    return SupervisedServerSync(policy, model, device, group_port=rollout.vllm.server_group_port,
                                max_restarts=rollout.vllm.max_restarts, restartable=restartable, run_dir=run_dir)  # fmt: skip


def server_generator(config: TrainConfig, model_path: str | Path, tokenizer: object, sampling: SamplingParams,
                     device: torch.device, run_dir: str | Path) -> VLLMServerPolicy:  # fmt: skip
    """The generator of a server-mode run: a client of ``rollout.vllm.server_url``, or of a server started
    here (stopped by the client's ``close()``) whose workers carry the trainer's ``WeightReceiver``."""
    from rl_llm.agents.vllm_server import VLLMServerPolicy
    from rl_llm.trainers.server_sync import WEIGHT_RECEIVER, server_placement

    vllm = config.rollout.vllm
    if vllm.server_url:
        return VLLMServerPolicy(vllm.server_url, str(model_path), tokenizer=tokenizer, sampling=sampling,
                                seed=config.seed if vllm.seeded_draws else None)  # fmt: skip
    gpus, own_gpu = server_placement(device, vllm.server_gpus)
    args = ["--dtype", config.model.dtype, "--seed", str(config.seed)]
    if vllm.max_model_len:
        args += ["--max-model-len", str(vllm.max_model_len)]
    if device.type == "cuda" and not own_gpu:  # one GPU for both: the server takes only its share
        args += ["--gpu-memory-utilization", str(vllm.gpu_memory_utilization)]
    log_path = Path(run_dir) / "vllm-server.log"
    # The trainer's weight receiver in the server's workers: ServerWeightSync pushes weights into them.
    server_options = {"worker_extension": WEIGHT_RECEIVER, "gpus": gpus, "log_path": log_path}
    return VLLMServerPolicy.launch(model_path, server_args=[*args, *vllm.server_args], server_options=server_options,
                                  sampling=sampling, tokenizer=tokenizer,
                                  seed=config.seed if vllm.seeded_draws else None)  # fmt: skip
