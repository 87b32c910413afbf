"""The training configuration: nested dataclasses, loaded from YAML and overridden by ``key=value`` pairs.

``load_config("configs/x.yaml", ["optim.lr=3e-6", "env.kwargs.horizon=5"])`` reads the file, applies the
overrides (dotted keys reach nested sections; values are parsed as YAML) and checks every key and type, so
a typo fails at once with the key's full path and, where one is close, the intended name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import operator
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rl_llm.errors import RLLMError
from rl_llm.paths import load_yaml, yaml_problem
from rl_llm.trainers.curriculum import CurriculumConfig
from rl_llm.trainers.filtering import FilterConfig
from rl_llm.trainers.trackers import report_to_problem
from rl_llm.trainers.turn_credit import AdvantageConfig

ALGORITHMS = ("grpo", "drgrpo", "rloo", "reinforce", "ppo", "gigpo")


class ConfigError(RLLMError, ValueError):
    """A configuration key or value that cannot be used, with the offending key's full path."""


@dataclass
class EnvConfig:
    id: str = "rl-llm/MultiArmedBandit-v0"
    kwargs: dict[str, Any] = field(default_factory=dict)
    # Training tasks come from seeds train_seed, train_seed+1, ... (each seed = one task = one GRPO group).
    train_seed: int = 0
    # Optional text the action is wrapped in before the env parses it, e.g. "<action>{}</action>": the
    # generator then writes only the tag's content. Off (None) by default; the default job documents its use.
    action_template: str | None = None


@dataclass
class LoraConfig:
    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: str | list[str] = "all-linear"


@dataclass
class ModelConfig:
    path: str = "tiny"  # "tiny" builds the local tiny model; otherwise a local HF model directory
    # float32 | bfloat16 | float16: the precision forward passes compute in. bfloat16 / float16 are mixed
    # precision (trainers/precision.py): trained weights and optimizer state stay float32, forward passes and
    # generation run under autocast, float16 adds loss scaling; frozen weights (a LoRA base) stay in this dtype.
    dtype: str = "float32"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # CUDA only: the same config and seed give the same run on the same machine and batch layout. Sets
    # torch.use_deterministic_algorithms(True, warn_only=True), strict during backward passes (warn_only
    # leaves attention's backward non-deterministic), cuDNN deterministic without autotuning, cuDNN's SDPA off, and
    # CUBLAS_WORKSPACE_CONFIG=:4096:8 (unless set). Costs speed: some kernels (scatter/index_add, attention
    # backward) take slower deterministic paths; an op without one warns, or in a backward pass stops the run
    # with a line naming it. No effect on CPU runs.
    deterministic: bool = True
    gradient_checkpointing: bool = False
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class VllmConfig:
    # colocate: in-process engine, load_weights + sleep/wake; server: a vLLM server process, weights pushed over a
    # torch process group (NCCL between GPUs, else gloo on CPU tensors; trainers/server_sync.py)
    mode: str = "colocate"
    gpu_memory_utilization: float = 0.3  # of the GPU the engine shares with the trainer (of host RAM on CPU)
    sleep: bool = True  # put the engine to sleep during updates to free the GPU memory it holds
    # server mode: null starts a server of model.path on a free local port (stopped with the run); a URL uses a
    # running one, started with VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls
    # rl_llm.trainers.server_sync.WeightReceiver
    server_url: str | None = None
    server_group_port: int = 0  # the weight group's rendezvous port on the trainer's machine; 0: a free one
    # CUDA_VISIBLE_DEVICES of a started server; null: a GPU of its own when there are two or more (the last one
    # the trainer does not use), else it shares the trainer's with gpu_memory_utilization
    server_gpus: str | None = None
    server_args: list[str] = field(default_factory=list)  # more flags for a started server
    # a started server that dies is restarted (same flags, the trainer's current weights pushed) at most this
    # many times per run; past that, or for a server_url server, the run stops with one error line naming the
    # server's log and the resume command (docs/vllm.md#when-the-server-dies)
    max_restarts: int = 3
    max_model_len: int | None = None
    # Each request its own seed, named as the hf backend names its draws (run seed, episode seed, group member,
    # turn, seat): the same draws whatever the batch where vLLM's logits are batch-invariant. Off by default:
    # vLLM samples seeded requests one by one at every decode step, a cost at large batches (docs/vllm.md).
    seeded_draws: bool = False


@dataclass
class RolloutConfig:
    backend: str = "hf"
    group_size: int = 8  # rollouts per task (the GRPO group)
    prompts_per_step: int = 8  # distinct tasks per step
    max_new_tokens: int = 64  # per turn
    temperature: float = 1.0
    top_p: float = 1.0
    concurrency: int = 64  # environments stepped at once by the rollout engine
    # PODS: keep this many rollouts per group (max-variance down-sampling); None keeps all.
    pods_keep: int | None = None
    # Asynchronous training (trainers/async_grpo.py): generation runs at most this many policy versions ahead
    # of the update. None: the synchronous loop; 0: asynchronous machinery, synchronous schedule (same metrics).
    max_staleness: int | None = None
    # APRIL partial rollouts (asynchronous mode only): start `partial_extra_groups` more groups than a step
    # needs; once `prompts_per_step` groups have finished, the rest pause and resume in the next step.
    partial_rollouts: bool = False
    partial_extra_groups: int = 2
    vllm: VllmConfig = field(default_factory=VllmConfig)
    # Dynamic sampling: drop groups without signal, replace them (trainers/filtering.py, docs/training.md).
    filter: FilterConfig = field(default_factory=FilterConfig)


@dataclass
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    epochs: int = 1  # passes over each batch
    minibatches: int = 1  # optimizer steps per epoch
    micro_batch_size: int = 8  # rows per forward pass; the rest of a minibatch is gradient accumulation


@dataclass
class LossConfig:
    clip_low: float = 0.2
    # Clip-higher (DAPO): the upper bound of the PPO ratio. It only acts when a batch gets several optimizer steps
    # (optim.minibatches or optim.epochs > 1): with one step the ratio is exactly 1 and no bound binds, so a
    # run with one step per batch and clip_high != clip_low logs a warning saying it is inert.
    clip_high: float = 0.28
    kl_coef: float = 0.0  # k3 KL to the frozen initial policy, as a loss term
    entropy_coef: float = 0.0
    # seq_mean_token_mean | token_mean | seq_sum_constant; None: seq_sum_constant for drgrpo (Dr. GRPO's
    # constant normalisation), seq_mean_token_mean otherwise.
    aggregation: str | None = None
    # seq_sum_constant divisor (the generation budget); None = rollout.max_new_tokens. For multi-turn
    # episodes set it to the whole episode's budget.
    norm_constant: float | None = None
    # Truncated importance sampling of the generator/trainer mismatch (TIS): each policy token's loss is weighted
    # by min(exp(trainer old log-prob - generator log-prob), tis_cap). None: off. verl and SkyRL use about 2.
    tis_cap: float | None = None


@dataclass
class PPOConfig:
    gamma: float = 1.0
    lam_actor: float = 0.95
    lam_critic: float = 1.0
    whiten_advantages: bool = True
    value_coef: float = 0.5
    value_clip: float | None = 0.2
    critic_lr: float | None = None  # None = optim.lr
    critic_warmup_steps: int = 0  # VC-PPO value pretraining: critic-only updates before the policy moves


@dataclass
class OTCConfig:
    enabled: bool = False
    variant: str = "grpo"  # grpo | ppo
    alpha: float = 1.0
    c: float = 1.0
    metric: str = "tool_calls"  # env metric holding the number of tool calls


@dataclass
class EvalConfig:
    episodes: int = 32  # held-out episodes, seeds seed..seed+episodes-1 (disjoint from training seeds)
    seed: int = 100_000
    every: int = 0  # also evaluate every N steps (0: only before and after)
    baselines: list[str] = field(default_factory=lambda: ["random"])
    temperature: float = 1.0


@dataclass
class LogConfig:
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    tensorboard: bool = True  # false: no TensorBoard events, whatever report_to says
    # Where scalars, the config, sampled episodes and the summary go besides metrics.jsonl: any of tensorboard,
    # wandb, trackio, mlflow (each an extra, imported only when named; docs/trackers.md).
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    project: str | None = None  # W&B / trackio project, MLflow experiment; null: the tool's env variable, else rl-llm
    run_name: str | None = None  # the tracker run's name; null: the run directory's name
    progress: bool = True  # rich live display (off when stdout is not a terminal)
    samples: int = 2  # episodes per step kept in samples.jsonl (best and worst return) for `rl-llm view`
    plot: bool = True


@dataclass
class SFTConfig:
    # Warm start (trainers/sft.py): before RL, fine-tune on `episodes` episodes played by the env's baseline
    # `baseline` (e.g. tic-tac-toe's minimax) on seeds seed.. (disjoint from training and eval seeds). 0: off.
    episodes: int = 0
    epochs: int = 1
    lr: float = 1e-3
    batch_size: int = 32  # episodes per optimizer step
    baseline: str = "minimax"
    seed: int = 1_000_000
    held_out_episodes: int = 64  # more expert episodes, not trained on: the NLL before/after in warm_start.json
    # Or warm-start from a file instead of playing `baseline`: an sft-jsonl file (`rl-llm export --format
    # sft-jsonl`, docs/export.md#warm-starting-the-trainer-from-a-file). Its last `held_out_episodes` episodes
    # are held out; `episodes` caps the rest (0: all of them).
    data: str | None = None

    @property
    def enabled(self) -> bool:
        return self.episodes > 0 or bool(self.data)


@dataclass
class SocialConfig:
    """Two-player games only (``env.id: social/<game>``; docs/multi-agent.md). None: the game's preset
    (``rl_llm.trainers.social.GAME_PRESETS``, the paper's values)."""

    # Who plays the learner's opponent, drawn per seed group by weight: "self_play" (both seats are the current
    # policy, both trained on) or a baseline of the game (tit_for_tat, always_defect, minimax, ...).
    opponents: dict[str, float] = field(default_factory=lambda: {"self_play": 1.0})
    learner_seat: str = "alternate"  # against a baseline: alternate (by seed) | player_0 | player_1
    # round: per-round discounted returns with a per-round leave-one-out baseline over the seed group (the
    # paper's credit; algorithm rloo, or reinforce for no baseline) | outcome: the algorithm's estimator on
    # whole-game returns.
    credit: str = "round"
    gamma: float | None = None  # discount of the per-round returns
    reward_scale: float | None = None  # rewards are divided by this normalising constant
    advantage_alignment: bool = False  # A* = A1 + beta * (sum_{k<t} gamma_aa^(t-k) A1_k) * A2
    beta: float | None = None
    gamma_aa: float | None = None
    role_baseline: bool | None = None  # baseline per seat (zero-sum self-play: the seats' advantages do not cancel)
    # Subtracted from the advantage of an invalid turn's tokens (round credit). The paper constrains decoding to
    # legal moves; without that, an invalid move played as the default (defect) shares defection's credit.
    invalid_penalty: float = 0.0
    # round: an invalid turn's tokens share the round's credit, less invalid_penalty (where the env's own reward
    # penalises an illegal move, as TicTacToe's does) | penalty: they get -invalid_penalty alone. An invalid
    # reply the game plays as a move is not that move: with "round" it shares the move's credit, and a rare
    # invalid token with a large positive credit is pushed up hard (docs/multi-agent.md#centred-advantages).
    invalid_credit: str = "round"
    # Subtract the batch mean of the learner's per-round advantages (after Advantage Alignment, before the
    # invalid penalty). In self-play the Advantage Alignment term has a negative mean, which without
    # constrained decoding pushes probability off both legal moves onto invalid replies
    # (docs/multi-agent.md#centred-advantages).
    center_advantages: bool = False
    # The league (opponent "league"): up to league_size past policies (the paper: 30; 0: off), the current one
    # added every league_every steps from step 0 on, the oldest evicted (docs/multi-agent.md#the-league).
    league_size: int = 0
    league_every: int = 1
    per_seat_policies: bool = False  # a separate policy per seat: not implemented yet (refused)
    # The baseline whose return against the trained policy is its exploitability; None: the game's greedy one
    # (always_defect in the matrix games, greedy in the Split games, minimax in TicTacToe).
    exploiter: str | None = None


@dataclass
class TrainConfig:
    algorithm: str = "grpo"
    steps: int = 100
    seed: int = 0
    out_dir: str | None = None
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    otc: OTCConfig = field(default_factory=OTCConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    social: SocialConfig = field(default_factory=SocialConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)  # trainers/curriculum.py
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)  # per-turn credit: trainers/turn_credit.py

    @property
    def game(self) -> str | None:
        """The two-player game this config trains on (``env.id: social/<game>``), else None."""
        return self.env.id.removeprefix("social/") if self.env.id.startswith("social/") else None

    def validate(self) -> TrainConfig:
        from rl_llm.trainers.social import check_env_config  # lazy: it imports this module

        check_env_config(self)  # env.id known; single-agent-only and game-only options where they belong
        if self.loss.aggregation is None:
            self.loss.aggregation = "seq_sum_constant" if self.algorithm == "drgrpo" else "seq_mean_token_mean"
        choices = {
            "algorithm": (self.algorithm, ALGORITHMS),
            "loss.aggregation": (self.loss.aggregation, ("seq_mean_token_mean", "token_mean", "seq_sum_constant")),
            "model.dtype": (self.model.dtype, ("float32", "bfloat16", "float16")),
            "otc.variant": (self.otc.variant, ("grpo", "ppo")),
        }
        for key, (value, allowed) in choices.items():
            if value not in allowed:
                raise ConfigError(f"{key}: {value!r} is not one of {list(allowed)}")
        positive = {
            "steps": self.steps, "rollout.group_size": self.rollout.group_size,
            "rollout.prompts_per_step": self.rollout.prompts_per_step,
            "rollout.max_new_tokens": self.rollout.max_new_tokens, "rollout.concurrency": self.rollout.concurrency,
            "optim.epochs": self.optim.epochs, "optim.minibatches": self.optim.minibatches,
            "optim.micro_batch_size": self.optim.micro_batch_size, "eval.episodes": self.eval.episodes,
            "optim.lr": self.optim.lr, "rollout.temperature": self.rollout.temperature,
        }  # fmt: skip
        for key, value in positive.items():
            if value <= 0:
                raise ConfigError(f"{key} must be positive, got {value}")
        self._check_ranges()
        if len(self.optim.betas) != 2 or not all(0 <= beta < 1 for beta in self.optim.betas):
            raise ConfigError(f"optim.betas must be two numbers in [0, 1) (Adam's), got {self.optim.betas}")
        if self.optim.minibatches > self.rollout.group_size * self.rollout.prompts_per_step:
            raise ConfigError("optim.minibatches cannot exceed the batch size (group_size * prompts_per_step)")
        if not (0 <= self.loss.clip_low < 1 and self.loss.clip_high >= 0):
            raise ConfigError("loss.clip_low must be in [0, 1) and loss.clip_high >= 0")
        if self.loss.tis_cap is not None and self.loss.tis_cap < 1:
            raise ConfigError(f"loss.tis_cap must be null (off) or >= 1, got {self.loss.tis_cap}")
        if self.rollout.pods_keep is not None and not 1 <= self.rollout.pods_keep <= self.rollout.group_size:
            raise ConfigError(f"rollout.pods_keep must be in 1..group_size ({self.rollout.group_size})")
        if self.env.action_template is not None and self.env.action_template.count("{}") != 1:
            raise ConfigError("env.action_template must contain exactly one '{}' (where the generated text goes)")
        if self.rollout.max_staleness is not None and self.rollout.max_staleness < 0:
            raise ConfigError(f"rollout.max_staleness must be null or >= 0, got {self.rollout.max_staleness}")
        if self.rollout.partial_rollouts and self.rollout.max_staleness is None:
            raise ConfigError("rollout.partial_rollouts needs the asynchronous loop: set rollout.max_staleness")
        if self.rollout.partial_extra_groups < 0:
            raise ConfigError("rollout.partial_extra_groups must be >= 0")
        if self.rollout.max_staleness is not None and self.algorithm == "ppo":
            raise ConfigError("rollout.max_staleness: the asynchronous loop is GRPO-family only (no critic)")
        from rl_llm.trainers.generation import check_generation_config  # lazy: it imports this module

        check_generation_config(self)  # rollout.backend x rollout.vllm.mode x asynchronous
        if self.optim.epochs * self.optim.minibatches == 1 and self.loss.clip_high != self.loss.clip_low:
            import logging

            logging.getLogger(__name__).warning(
                "loss.clip_high=%s is inert: with one optimizer step per batch the PPO ratio is 1 (set "
                "optim.minibatches or optim.epochs above 1 for clip-higher to act)", self.loss.clip_high)
        if (problem := report_to_problem(self.log.report_to)) is not None:
            raise ConfigError(problem)  # e.g. "wandb is not installed; pip install 'rl-llm[wandb]'"
        if self.sft.episodes < 0 or self.sft.held_out_episodes < 0:
            raise ConfigError("sft.episodes and sft.held_out_episodes must be >= 0 (0 episodes: no warm start)")
        if self.sft.data is not None and not Path(self.sft.data).is_file():
            raise ConfigError(f"sft.data: no such file {self.sft.data!r} (write one with rl-llm export --format sft-jsonl)")
        if self.sft.enabled and (self.sft.epochs < 1 or self.sft.batch_size < 1 or self.sft.lr <= 0):
            raise ConfigError("sft.epochs and sft.batch_size must be >= 1 and sft.lr positive")
        from rl_llm.trainers.curriculum import check_curriculum_config
        from rl_llm.trainers.filtering import check_filter_config
        from rl_llm.trainers.turn_credit import check_advantage_config

        check_filter_config(self)
        check_curriculum_config(self)
        check_advantage_config(self)
        if self.algorithm in ("grpo", "drgrpo", "rloo", "gigpo") and self.rollout.group_size < 2:
            raise ConfigError(f"{self.algorithm} needs rollout.group_size >= 2 (a group baseline)")
        return self


    def _check_ranges(self) -> None:
        """Every bounded number within its bounds, named (NaN and infinity never reach here: ``_coerce``).
        Each one got through before and failed later, some after minutes of work: a negative seed at the first
        env reset, ``log.checkpoint_every=0`` as a ZeroDivisionError after the first step, ``optim.max_grad_norm=0``
        zeroed every gradient, a ``rollout.top_p`` or ``ppo.gamma`` out of range trained on nonsense."""
        for key, low, high in RANGES:
            value = operator.attrgetter(key)(self)
            if value is None:
                continue  # the key's "off" or "default" (its type says where null is allowed)
            low_ok = value > low[1] if low[0] == "(" else value >= low[1]
            high_ok = high is None or (value < high[1] if high[0] == ")" else value <= high[1])
            if not (low_ok and high_ok):
                bound = f"{low[0]}{low[1]}, {high[1]}{high[0]}" if high is not None else None
                where = f"in {bound}" if bound else f"{'>' if low[0] == '(' else '>='} {low[1]}"
                raise ConfigError(f"{key} must be {where}, got {value}")


# Bounds of numeric keys: ("[", x) is >= x, ("(", x) is > x; the upper bound alike with "]" / ")", None: none.
RANGES: list[tuple[str, tuple[str, float], tuple[str, float] | None]] = [
    # numpy's seeding takes at most 2**32 - 1 (a larger seed failed after start-up in numpy's words)
    *((key, ("[", 0), ("]", 2**32 - 1)) for key in ("seed", "env.train_seed", "eval.seed", "sft.seed")),
    ("model.lora.r", ("[", 1), None), ("model.lora.alpha", ("(", 0), None), ("model.lora.dropout", ("[", 0), (")", 1)),
    ("rollout.top_p", ("(", 0), ("]", 1)), ("rollout.vllm.gpu_memory_utilization", ("(", 0), ("]", 1)),
    ("rollout.vllm.server_group_port", ("[", 0), ("]", 65535)),
    ("optim.weight_decay", ("[", 0), None), ("optim.eps", ("(", 0), None), ("optim.warmup_steps", ("[", 0), None),
    ("optim.max_grad_norm", ("(", 0), None), ("loss.kl_coef", ("[", 0), None),
    *((key, ("[", 0), ("]", 1)) for key in ("ppo.gamma", "ppo.lam_actor", "ppo.lam_critic")),
    ("ppo.value_coef", ("[", 0), None), ("ppo.value_clip", ("(", 0), None), ("ppo.critic_lr", ("(", 0), None),
    ("ppo.critic_warmup_steps", ("[", 0), None), ("otc.alpha", ("[", 0), None), ("otc.c", ("(", 0), None),
    ("eval.every", ("[", 0), None), ("eval.temperature", ("[", 0), None), ("log.checkpoint_every", ("[", 1), None),
    ("log.keep_checkpoints", ("[", 1), None), ("log.samples", ("[", 0), None),
    ("advantage.gigpo_weight", ("[", 0), None),
    ("loss.norm_constant", ("[", 1), None),
    ("rollout.vllm.max_model_len", ("[", 1), None),  # a budget of tokens: 0 fell back to max_new_tokens, 1e-300 NaN grads
]  # fmt: skip


# -- loading ------------------------------------------------------------------------------------------------
def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check ``value`` against a type annotation (dataclass, Optional, Union, list, dict, scalars)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(annotation):
            try:
                return _coerce(value, option, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: expected {_type_name(annotation)}, got {type(value).__name__} {value!r}")
    if annotation is type(None):
        if value is None:
            return None
        raise ConfigError(f"{key}: expected null")
    if annotation is Any:
        return value
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of {annotation.__name__} fields, got {value!r}")
        return _build(annotation, value, key + ".")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        (item,) = typing.get_args(annotation) or (Any,)
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__} {value!r}")
        return {str(k): v for k, v in value.items()}
    if annotation is float and isinstance(value, str):  # YAML 1.1 reads "1e-6" as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    accepted = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}.get(annotation, ())
    if isinstance(value, accepted) and not (annotation is not bool and isinstance(value, bool)):
        if annotation is not float:
            return value
        try:
            number = float(value)  # an int past a float's range raises OverflowError
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):  # .nan and .inf are YAML floats; none is a setting here
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return number
    raise ConfigError(f"{key}: expected {_type_name(annotation)}, got {type(value).__name__} {value!r}")


def _build(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in values:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            # the whole dotted path quoted once: 'optim.lrr', not optim.'lrr'
            hint = f" (did you mean {prefix + close[0]!r}?)" if close else f"; valid keys: {', '.join(names)}"
            raise ConfigError(f"unknown config key {prefix + str(key)!r}{hint}")
    return cls(**{key: _coerce(value, hints[key], prefix + key) for key, value in values.items()})


def apply_override(tree: dict[str, Any], pair: str) -> None:
    """Set ``a.b.c=value`` in a nested dict (the value is parsed as YAML: numbers, lists, null...)."""
    key, sep, raw = pair.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override must look like key=value, got {pair!r}")
    parts = key.strip().split(".")
    node = tree
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(parts[: depth + 1])} is not a section; cannot set {key!r}")
        node = child
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as error:
        raise ConfigError(f"override {pair!r}: value is not valid YAML ({yaml_problem(error)})") from error
    if isinstance(value, dict) and isinstance(node.get(parts[-1]), dict) and _is_section(parts):
        _merge(node[parts[-1]], value)  # as a config file's section merges: optim={minibatches: 1} keeps lr
    else:
        node[parts[-1]] = value  # a value, or a dict-valued setting (env.kwargs={...}): replaced whole


def _is_section(parts: list[str]) -> bool:
    """Whether ``a.b`` names a section of ``TrainConfig`` (a dataclass of settings), not a setting."""
    kind: Any = TrainConfig
    for part in parts:
        if not dataclasses.is_dataclass(kind):
            return False
        fields = {field.name: field for field in dataclasses.fields(kind)}
        if part not in fields:
            return False
        kind = typing.get_type_hints(kind)[part]
    return dataclasses.is_dataclass(kind)


def check_overrides_unique(overrides: list[str]) -> None:
    """Refuse a key given twice on a command line (``optim.lr=1 optim.lr=2``), as Hydra does ("Multiple
    values for optim.lr"): the last would win silently, and the first was most likely meant too. (``load_config``
    itself applies its overrides in order, so code can layer specifics over a base list.)"""
    first: dict[str, str] = {}
    for pair in overrides:
        key = pair.partition("=")[0].strip()
        if key in first:
            raise ConfigError(f"multiple values for {key!r} ({first[key]!r} and {pair!r}); give each key once")
        # A section and a key inside it (optim={lr: 1} and optim.lr=2): one of the two was not meant to win.
        inside = next((other for other in first if other.startswith(key + ".") or key.startswith(other + ".")), None)
        if inside is not None:
            raise ConfigError(f"{first[inside]!r} and {pair!r} overlap (a section and a key inside it); give the "
                              "section's keys one way, each as section.key=value")  # fmt: skip
        first[key] = pair


def config_from_dict(values: dict[str, Any]) -> TrainConfig:
    return _build(TrainConfig, values).validate()


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                base: dict[str, Any] | None = None) -> TrainConfig:
    """``base`` (a dict) updated by the YAML file at ``path``, then by ``overrides``; checked and typed."""
    tree: dict[str, Any] = _deep_copy(base or {})
    if path is not None:
        try:
            loaded = load_yaml(Path(path).read_text(encoding="utf-8")) or {}
        except (OSError, UnicodeDecodeError) as error:  # missing, a directory, not text
            raise ConfigError(f"cannot read config file {path}: {error}") from error
        except yaml.YAMLError as error:
            raise ConfigError(f"config file {path} is not valid YAML: {yaml_problem(error)}") from error
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        _merge(tree, loaded)
    for pair in overrides or []:  # in order, a later one winning: code may layer a base list and specifics
        apply_override(tree, pair)
    return config_from_dict(tree)


def config_to_dict(config: TrainConfig) -> dict[str, Any]:
    return dataclasses.asdict(config)


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _deep_copy(tree: dict[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in tree.items()}
