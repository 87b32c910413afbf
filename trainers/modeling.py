"""Models for training: the policy (optionally with LoRA through peft), the PPO critic and per-token log-probs.

Every per-token tensor is aligned with the tokens: entry ``t`` belongs to token ``t`` and is computed from the
model's output at position ``t - 1`` (the state in which token ``t`` was chosen); entry 0 is 0.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from rl_llm.trainers.config import LoraConfig, ModelConfig
from rl_llm.trainers.losses import entropy_from_logits

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


def load_causal_lm(path: str | Path, config: ModelConfig, device: torch.device) -> nn.Module:
    """A local Hugging Face causal LM in training mode, with LoRA adapters when ``config.lora.enabled``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[config.dtype]).to(device)
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
        hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        select = positions[:, 1:].to(torch.bool)
        logits = model.get_output_embeddings()(hidden[:, :-1][select]).float()
        targets = input_ids[:, 1:][select]
    else:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
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
    ``t - 1``), the same alignment as the log-probs.
    """

    def __init__(self, causal_lm: nn.Module) -> None:
        super().__init__()
        trunk = getattr(causal_lm, causal_lm.base_model_prefix, None)
        if trunk is None or trunk is causal_lm:
            raise ValueError(f"cannot find the transformer trunk of {type(causal_lm).__name__} for the critic")
        self.trunk = copy.deepcopy(trunk)
        self.trunk.requires_grad_(True)
        hidden = causal_lm.config.hidden_size
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.head.to(device=next(self.trunk.parameters()).device, dtype=next(self.trunk.parameters()).dtype)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.trunk(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        values = self.head(hidden[:, :-1]).squeeze(-1).float()
        return torch.nn.functional.pad(values, (1, 0))


class FrozenReference:
    """Log-probs of the initial policy for the KL term: the base model with adapters off under LoRA,
    otherwise a frozen copy. Build it from the freshly loaded model, before a checkpoint is restored."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.copy: nn.Module | None = None
        if not is_peft(model):
            self.copy = copy.deepcopy(model).eval().requires_grad_(False)

    @torch.no_grad()
    def logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float, positions: torch.Tensor | None
    ) -> torch.Tensor:
        if self.copy is not None:
            return token_logprobs(self.copy, input_ids, attention_mask, temperature, positions=positions)[0]
        with self.model.disable_adapter():
            return token_logprobs(self.model, input_ids, attention_mask, temperature, positions=positions)[0]
