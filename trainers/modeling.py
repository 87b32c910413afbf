"""Models for training: the policy (optionally with LoRA through peft), the PPO critic and per-token log-probs.

Every per-token tensor is aligned with the tokens: entry ``t`` belongs to token ``t`` and is computed from the
model's output at position ``t - 1`` (the state in which token ``t`` was chosen); entry 0 is 0.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from rl_llm.agents.sampling import STRICT_MODE_LOCK
from rl_llm.trainers.config import ConfigError, LoraConfig, ModelConfig
from rl_llm.trainers.losses import entropy_from_logits

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"


def resolve_device(spec: str) -> torch.device:
    """``model.device`` as a torch device, checked against this machine: never a silent fallback to the CPU.

    ``auto`` is the current CUDA device when there is one, else the CPU (documented). An explicit ``cuda`` /
    ``cuda:N`` that this machine cannot give is a ``ConfigError`` naming what is missing. ``cuda`` gets its
    index (the current device), so it compares equal to the device of the tensors made on it.
    """
    if spec == "auto":
        return resolve_device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError):
        raise ConfigError(f"model.device: {spec!r} is not a device; use {DEVICE_CHOICES}") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise ConfigError(f"model.device: {spec!r} is not supported by the trainer; use {DEVICE_CHOICES}")
    if not torch.cuda.is_available():
        why = "this torch is a CPU-only build" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ConfigError(f"model.device={spec} but CUDA is not available ({why}, torch {torch.__version__}); "
                          "use model.device=cpu, or auto (the GPU when there is one)")  # fmt: skip
    count = torch.cuda.device_count()
    if device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    if device.index >= count:
        raise ConfigError(f"model.device={spec} but this machine has {count} visible CUDA device(s) "
                          f"(cuda:0 to cuda:{count - 1}; CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
    return device


def use_device(device: torch.device) -> torch.device:
    """Make ``device`` this process's current CUDA device (a no-op off CUDA) and return it.

    Code that says only "cuda" (libraries' defaults, NCCL, ``torch.cuda`` calls without an index) then means
    the trainer's GPU, so ``model.device=cuda:1`` puts nothing on, and opens no context on, GPU 0.
    """
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def make_deterministic(device: torch.device, enabled: bool = True) -> bool:
    """On CUDA, ask for deterministic kernels (``model.deterministic``); returns whether anything was set.

    The CUDA promise (issue #29) is the same run from the same config and seed on the same machine and batch
    layout, which some CUDA kernels break (atomics in scatter/index_add and attention backward, cuDNN's
    autotuner picking a kernel by timing, cuBLAS splitting work across streams). cuBLAS reads its workspace
    setting when it first starts, so call this before the first matmul on the GPU. Deterministic paths are
    slower for some kernels; outside the backward passes, ops that have none warn (``warn_only``) rather than
    stop the run (generation, vLLM's own torch ops). The backward passes run strict (``strict_determinism``).
    Process-wide.

    CPU runs are left alone: their determinism comes from the batch-invariant layout and fixed seeds, and
    ``use_deterministic_algorithms`` would change nothing there but could raise for some ops.
    """
    if device.type != "cuda" or not enabled:
        return False
    if "CUBLAS_WORKSPACE_CONFIG" not in os.environ and torch.cuda.is_initialized():
        # cuBLAS reads the setting once, at its first matmul: if this process already ran one (a notebook, an
        # evaluation before the run), setting it now is too late and the strict backward will refuse cuBLAS.
        logger.warning("model.deterministic: CUDA was in use before the run set CUBLAS_WORKSPACE_CONFIG; if a "
                       "matmul ran already, the backward may stop on cuBLAS. Set CUBLAS_WORKSPACE_CONFIG=:4096:8 "
                       "in the environment before starting Python")  # fmt: skip
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # a user's own setting wins
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    # SDPA picks its backend in the forward pass, which runs under warn_only, where cuDNN's attention may be
    # picked; its backward has no deterministic kernel, so the strict backward would then refuse it and stop
    # the run. Flash and memory-efficient attention (and the math path) have deterministic backwards.
    torch.backends.cuda.enable_cudnn_sdp(False)
    return True


@contextmanager
def strict_determinism() -> Iterator[None]:
    """While open, PyTorch's deterministic mode, if on, is strict rather than ``warn_only``; wrap backward in it.

    Under ``warn_only`` PyTorch keeps the default, split-key backward of SDPA's memory-efficient and flash
    attention, which is not deterministic, and only warns once ("Memory Efficient attention defaults to a
    non-deterministic algorithm"; the first GPU run, on an H200, printed it in its training logs): gradients, and
    so the run, could differ between two runs of one config. Strict, it takes the deterministic backward; an op with
    no deterministic kernel then raises, and ``rl-llm train`` names it in one line (``nondeterminism_message``).
    Only the backward passes: generation (transformers', vLLM's) keeps ``warn_only``. Process-wide while open,
    like the mode itself, so it holds ``rl_llm.agents.sampling.STRICT_MODE_LOCK``, which the hf backend holds
    while it generates: the asynchronous loop's generator thread would otherwise sample under the strict mode,
    where the sampler's CUDA cumsum (no deterministic kernel) raises and the episodes are dropped."""
    if not torch.are_deterministic_algorithms_enabled() or not torch.is_deterministic_algorithms_warn_only_enabled():
        yield
        return
    with STRICT_MODE_LOCK:  # no hf generation runs meanwhile on another thread (agents/sampling.py says why)
        torch.use_deterministic_algorithms(True, warn_only=False)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(True, warn_only=True)


# PyTorch's refusals under use_deterministic_algorithms(True): an op without a deterministic kernel, SDPA's
# split-key backward, cuBLAS without its workspace setting.
_NONDETERMINISM_MARKS = ("does not have a deterministic implementation", "deterministic mode is enabled",
                         "use_deterministic_algorithms(True)")  # fmt: skip


def nondeterminism_message(error: BaseException) -> str | None:
    """One line for PyTorch's refusal of an operation under ``model.deterministic``; None for other errors."""
    text = str(error).strip()
    if not isinstance(error, RuntimeError) or not any(mark in text for mark in _NONDETERMINISM_MARKS):
        return None
    first = text.splitlines()[0].split(", but you set")[0].split(". You can")[0].rstrip(".")
    return (f"model.deterministic=true, and PyTorch refused an operation that has no deterministic CUDA kernel "
            f"({first}); set model.deterministic=false to train without it (the run then does not repeat bit "
            f"for bit)")  # fmt: skip


def release_cached_memory(device: torch.device) -> None:
    """Give the memory PyTorch's caching allocator holds unused on ``device`` back to the driver.

    Called between phases (rollout -> update, after the SFT warm start): what one phase freed is then there for
    the next, or for a generator sharing the GPU, instead of staying reserved by this process. A no-op off CUDA.
    """
    if device.type == "cuda":
        with torch.cuda.device(device):  # on the trainer's GPU, without opening a context on GPU 0
            torch.cuda.empty_cache()


def load_causal_lm(path: str | Path, config: ModelConfig, device: torch.device) -> nn.Module:
    """A local Hugging Face causal LM in training mode, with LoRA adapters when ``config.lora.enabled``.

    Trained weights are float32 whatever ``config.dtype`` (master weights; the low dtype is the autocast
    dtype of the forward passes, ``trainers/precision.py``). Under LoRA the base is frozen and loaded in
    ``config.dtype``; peft keeps the adapters it adds in float32.
    """
    from transformers import AutoModelForCausalLM

    dtype = DTYPES[config.dtype] if config.lora.enabled else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device)
    if config.gradient_checkpointing:
        # transformers 5 renamed it; older versions only have the first name
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
        if config.lora.enabled:
            model.enable_input_require_grads()  # checkpointed blocks need a grad-carrying input under LoRA
    if config.lora.enabled:
        model = apply_lora(model, config.lora)
    model.train()
    return model


def apply_lora(model: nn.Module, lora: LoraConfig) -> nn.Module:
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_config = PeftLoraConfig(
        r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )  # fmt: skip
    return get_peft_model(model, peft_config)


def is_peft(model: nn.Module) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters that training changes (the LoRA adapters alone under peft), for checkpoints."""
    if is_peft(model):
        names = {name for name, p in model.named_parameters() if p.requires_grad}
        return {name: t for name, t in model.state_dict().items() if name in names}
    return model.state_dict()


def _selects_positions(model: nn.Module) -> bool:
    """Whether logits can be computed from gathered hidden states: a plain linear head, no logit post-scaling."""
    config = getattr(model, "config", None)
    return (
        hasattr(model, "get_decoder")
        and isinstance(model.get_output_embeddings(), nn.Linear)
        and not getattr(config, "final_logit_softcapping", None)
        and getattr(config, "logit_scale", None) in (None, 1.0)
    )


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log pi(token_t | tokens_<t)`` per token (``[N, T]``, 0 at t=0), and the entropy there if asked.

    Logits are divided by the sampling temperature, so the log-probs are those of the distribution the
    generator sampled from. ``positions`` (bool ``[N, T]``, e.g. the policy-token mask) limits the work to
    those tokens: the LM head then runs only on the hidden states that predict them (entries elsewhere are
    0), which matters in multi-turn episodes where most tokens are prompt and env text. The entropy carries
    gradient only with ``entropy_grad`` (an entropy bonus); otherwise it is a detached figure for logging.
    """
    if positions is not None and _selects_positions(model):
        # use_cache=False: a scoring pass has no next token to decode, and the model's default (a KV cache of
        # every layer, kept until the output is freed) would hold all layers' keys and values at once.
        hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                                     use_cache=False).last_hidden_state  # fmt: skip
        select = positions[:, 1:].to(torch.bool)
        logits = model.get_output_embeddings()(hidden[:, :-1][select]).float()
        targets = input_ids[:, 1:][select]
    else:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1].float()
        select, targets = None, input_ids[:, 1:]
    if temperature != 1.0:
        logits = logits / temperature
    chosen = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    entropy = None
    if with_entropy or entropy_grad:
        entropy = entropy_from_logits(logits if entropy_grad else logits.detach())
    return _scatter(chosen, select, input_ids.shape), None if entropy is None else _scatter(entropy, select, input_ids.shape)


def _scatter(values: torch.Tensor, select: torch.Tensor | None, shape: torch.Size) -> torch.Tensor:
    """Per-token values back onto the ``[N, T]`` grid (shifted by one: entry t comes from position t-1)."""
    if select is None:
        return torch.nn.functional.pad(values, (1, 0))
    out = values.new_zeros((shape[0], shape[1] - 1)).masked_scatter(select, values)
    return torch.nn.functional.pad(out, (1, 0))


class Critic(nn.Module):
    """PPO value model: a copy of the policy's transformer trunk and a scalar head.

    ``values[:, t]`` estimates the return from the state before token ``t`` (the trunk's hidden state at
    ``t - 1``), the same alignment as the log-probs. All of it is trained, so it is float32 (master weights)
    even when copied from a low-precision LoRA base: trained in float16 it would turn NaN within a step.
    """

    def __init__(self, causal_lm: nn.Module) -> None:
        super().__init__()
        trunk = getattr(causal_lm, causal_lm.base_model_prefix, None)
        if trunk is None or trunk is causal_lm:
            raise ValueError(f"cannot find the transformer trunk of {type(causal_lm).__name__} for the critic")
        self.trunk = copy.deepcopy(trunk).float()
        self.trunk.requires_grad_(True)
        hidden = causal_lm.config.hidden_size
        weight = next(self.trunk.parameters())  # the head is made where the trunk is, not on the default device
        self.head = nn.Linear(hidden, 1, device=weight.device, dtype=weight.dtype)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.trunk(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        values = self.head(hidden[:, :-1]).squeeze(-1).float()
        return torch.nn.functional.pad(values, (1, 0))


class FrozenReference:
    """Log-probs of the initial policy for the KL term: the base model with adapters off under LoRA,
    otherwise a frozen copy. Build it from the freshly loaded model, before a checkpoint is restored.

    The copy keeps the policy's dtype (float32 master weights in a mixed-precision run) and runs under the same
    autocast, so it computes exactly the initial policy: the KL starts at 0. A float16 copy computes another
    function (its residual stream is float16 too): on the tiny model's PPO job kl_ref was 0.026 at the first
    step instead of 0, Adam turning the 1e-4 log-prob mismatch into full-size steps toward it."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.copy: nn.Module | None = None
        if not is_peft(model):
            self.copy = copy.deepcopy(model).eval().requires_grad_(False)

    @classmethod
    def snapshot(cls, model: nn.Module) -> FrozenReference:
        """A frozen copy of the policy as it is now (after a warm start), adapters merged under LoRA: there the
        base model with adapters off was the model from before the warm start, not the warm-started policy
        the KL term is meant to anchor to (the KL at the first step was 0.05 instead of 0 on the tiny model)."""
        reference = cls.__new__(cls)
        reference.model = model
        frozen = copy.deepcopy(model)
        reference.copy = (frozen.merge_and_unload() if is_peft(frozen) else frozen).eval().requires_grad_(False)
        return reference

    @torch.no_grad()
    def logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float, positions: torch.Tensor | None
    ) -> torch.Tensor:
        if self.copy is not None:
            return token_logprobs(self.copy, input_ids, attention_mask, temperature, positions=positions)[0]
        with self.model.disable_adapter():
            return token_logprobs(self.model, input_ids, attention_mask, temperature, positions=positions)[0]
