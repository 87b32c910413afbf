"""Everything a training loop needs around it, so ``grpo.py`` and ``ppo.py`` read as the algorithm alone.

``TrainingRun(config, run_dir)`` builds the model, optimizer, logs, and the generator (the rollout policy)
with its weight sync (``generation.build_generation``, the one place that picks them), and resumes from
``run_dir/checkpoints`` when a checkpoint is there. It then offers the steps of a loop: ``collect`` (rollout
engine), ``score`` (returns, OTC, PODS), ``log_step`` (metrics, periodic eval, checkpoint) and ``finish``
(final evaluation, summary, plots).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import yaml

import rl_llm  # noqa: F401  (registers the environments)
from rl_llm.envs.base import reported_correct
from rl_llm.envs.wrappers.action_template import ActionTemplate
from rl_llm.trainers.batch import TrainBatch, collate
from rl_llm.trainers.checkpoint import (
    Checkpointer,
    CheckpointError,
    restore_rng_state,
    rng_state,
    save_atomic,
    write_text_atomic,
)
from rl_llm.trainers.config import ConfigError, TrainConfig, config_to_dict
from rl_llm.trainers.curriculum import TaskSampler, train_env_factory
from rl_llm.trainers.evaluation import EvalResult, evaluate_baselines, evaluate_llm, print_comparison
from rl_llm.trainers.filtering import collect_step
from rl_llm.trainers.generation import build_generation, play_whole
from rl_llm.trainers.logging import MetricsWriter, ProgressDisplay, plot_comparison, plot_curves, read_metrics
from rl_llm.trainers.modeling import (
    Critic,
    FrozenReference,
    is_peft,
    load_causal_lm,
    make_deterministic,
    release_cached_memory,
    resolve_device,
    trainable_state,
    use_device,
)
from rl_llm.trainers.precision import Precision
from rl_llm.trainers.rewards import OTCTransform, pods_select
from rl_llm.trainers.trackers import Trackers, comparison_table
from rl_llm.types import Trajectory

logger = logging.getLogger(__name__)
# A warm-started run's KL anchor (the policy after its warm start), kept so that a resumed run anchors there too.
REFERENCE_FILE = "warm_start_reference.pt"


def env_factory(config: TrainConfig) -> Callable[[], gym.Env]:
    def make() -> gym.Env:
        try:
            env = gym.make(config.env.id, **config.env.kwargs)
        except TypeError as error:  # a value of the wrong type (env.kwargs.num_arms=abc): one line, not a traceback
            raise ConfigError(f"env.kwargs: {config.env.id} cannot be built with them: {error}") from error
        return ActionTemplate(env, config.env.action_template) if config.env.action_template else env

    return make


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class StepTimer:
    """Wall time per phase of one step (``with timer("rollout"): ...``); starting one also starts a new
    peak of the GPU memory PyTorch allocates (``memory/peak_gpu_gib`` in the step's metrics)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.started = time.perf_counter()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            for index in range(torch.cuda.device_count()):  # allocator counters (log_step reads the trainer's)
                torch.cuda.reset_peak_memory_stats(index)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        out = {f"time/{phase}_s": value for phase, value in self.seconds.items()}
        out["time/step_s"] = time.perf_counter() - self.started
        return out


def resolve_model_path(config: TrainConfig) -> Path:
    from rl_llm.agents.tiny import resolve_model

    path = Path(resolve_model(config.model.path)).expanduser()
    if not config.model.path or not path.is_dir():  # "" was the working directory
        raise FileNotFoundError(f"model.path {config.model.path!r} is not a local directory (no hub downloads here)")
    if not (path / "config.json").is_file():  # else transformers' several-line tokenizer error, naming no setting
        raise FileNotFoundError(f"model.path {config.model.path!r} holds no model (no config.json): a directory "
                                "saved by save_pretrained, or 'tiny'")  # fmt: skip
    return path


class TrainingRun:
    def __init__(self, config: TrainConfig, run_dir: str | Path, with_critic: bool = False) -> None:
        self.config = config
        device = resolve_device(config.model.device)  # a device this machine lacks fails here
        make_deterministic(device, config.model.deterministic)  # before anything runs on the GPU
        self.device = use_device(device)
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.checkpointer = Checkpointer(self.run_dir / "checkpoints", keep=config.log.keep_checkpoints)
        resume = self.checkpointer.latest()
        if resume is None:  # a fresh start, also of a run stopped before its first checkpoint (maybe another config)
            write_text_atomic(self.run_dir / "config.yaml", yaml.safe_dump(config_to_dict(config), sort_keys=False))
            (self.run_dir / "eval_before.json").unlink(missing_ok=True)  # that run's measure, not this one's
        seed_everything(config.seed)
        self.model_path = resolve_model_path(config)
        self._started = time.perf_counter()
        self.phase(f"loading {self.model_path} on {self.device}")
        self._build_models(with_critic)
        self.shuffle = torch.Generator().manual_seed(config.seed)
        self.otc = OTCTransform(config.otc.variant, config.otc.alpha, config.otc.c) if config.otc.enabled else None
        self.step = 0
        self.next_seed = config.env.train_seed
        self.pending_seeds: list[int] = []  # asynchronous runs: groups started below next_seed, not yet trained on
        self.dropped = 0
        # Two-player games (trainers/social.py): who plays the learner's opponent, and the last step's matches.
        self.opponents = None
        self.league = None  # past policies as opponents (trainers/league.py), when social.league_size > 0
        self.matches: list[Any] | None = None
        self.scored: list[Trajectory] = []  # the batch's rows, in order (score)
        if config.game is not None:
            from rl_llm.trainers.social import Opponents

            if config.social.league_size:
                from rl_llm.trainers.league import League

                self.league = League(self.run_dir / "league", config.social.league_size, config.social.league_every)
            self.opponents = Opponents(config, self.league)
        # The task sampler (curriculum) and the step's group counts (dynamic sampling): docs/training.md.
        self.tasks = TaskSampler(config, lambda: len(env_factory(config)().unwrapped.tasks))
        self.sampling_metrics: dict[str, float] = {}
        if resume is not None:
            self._restore(resume)
            self._restore_reference()
        self.make_env = env_factory(config)  # evaluation's env; training's may set a curriculum level
        self.train_env = train_env_factory(config, self.make_env)
        if resume is None and config.sft.enabled:  # warm start: SFT on expert episodes (trainers/sft.py)
            from rl_llm.trainers.sft import warm_start

            source = config.sft.data or f"{config.sft.episodes} episodes of the {config.sft.baseline} baseline"
            self.phase(f"warm start: SFT on {source}")
            warm_start(self)
            if self.reference is not None:  # the KL anchor is the warm-started policy, kept for a resumed run
                self.reference = FrozenReference.snapshot(self.model)
                save_atomic(self.reference.copy.state_dict(), self.run_dir / REFERENCE_FILE)
            release_cached_memory(self.device)  # the SFT optimizer's state and activations are garbage now
        # The generator (rollout policy) and its weight sync, as the config chooses (trainers/generation.py).
        vllm = f" ({config.rollout.vllm.mode})" if config.rollout.backend == "vllm" else ""
        self.phase(f"starting the generator: {config.rollout.backend}{vllm}")
        self.generation = build_generation(config, self.model, self.tokenizer, self.model_path, self.device,
                                           self.run_dir, self.precision)  # fmt: skip
        self.generator, self.sync = self.generation.policy, self.generation.sync
        try:  # the generator may be a server process: stop it if the run cannot start
            if self.step > 0:
                self.generation.load_state_dict(self._resumed_generation)  # e.g. the run's server restarts so far
            if self.step > 0 or config.sft.enabled:  # resumed or warm-started weights, not model.path's
                self.generation.catch_up(self.model, self._resumed_version if self.step > 0 else None)
        except BaseException:
            self.generation.close()
            raise
        try:  # the trackers of log.report_to (trainers/trackers.py): a failed start stops the generator too
            log = config.log
            trackers = Trackers(log.report_to, self.run_dir, config_to_dict(config), resumed=self.step > 0,
                                project=log.project, run_name=log.run_name)  # fmt: skip
        except BaseException:
            self.generation.close()
            raise
        self.metrics = MetricsWriter(self.run_dir, resume_step=self.step, trackers=trackers,
                                     tensorboard=log.tensorboard and "tensorboard" in log.report_to,
                                     config_text=yaml.safe_dump(config_to_dict(config), sort_keys=False))  # fmt: skip
        self.resumed_from = self.step

    # -- construction -------------------------------------------------------------------------------------
    def _build_models(self, with_critic: bool) -> None:
        from transformers import AutoTokenizer

        config = self.config
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = load_causal_lm(self.model_path, config.model, self.device)
        # Mixed precision (trainers/precision.py): float32 trained weights, forward passes under autocast in
        # model.dtype, float16 loss scaling. One per optimizer: each has its own loss scale.
        self.precision = Precision(config.model.dtype, self.device)
        # The reference is the initial policy: built now, before a checkpoint overwrites the weights.
        self.reference = FrozenReference(self.model) if config.loss.kl_coef > 0 else None
        self.optimizer = self._adam([p for p in self.model.parameters() if p.requires_grad], config.optim.lr)
        warmup = config.optim.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda n: min(1.0, (n + 1) / warmup) if warmup > 0 else 1.0
        )
        self.critic = self.critic_optimizer = self.critic_precision = None
        if with_critic:
            base = self.model.get_base_model() if is_peft(self.model) else self.model
            self.critic = Critic(base).to(self.device)
            self.critic_optimizer = self._adam(list(self.critic.parameters()), config.ppo.critic_lr or config.optim.lr)
            self.critic_precision = Precision(config.model.dtype, self.device)

    def _adam(self, parameters: list[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
        optim = self.config.optim
        return torch.optim.AdamW(parameters, lr=lr, betas=tuple(optim.betas), eps=optim.eps, weight_decay=optim.weight_decay)

    # -- the steps of a loop ------------------------------------------------------------------------------
    def collect(self) -> list[Trajectory]:
        """``group_size`` episodes for each of ``prompts_per_step`` new training tasks, with the current weights;
        the generator then frees its memory for the update (vLLM sleep mode)."""
        rollout = self.config.rollout
        seeds = list(range(self.next_seed, self.next_seed + rollout.prompts_per_step))
        self.next_seed += rollout.prompts_per_step
        self.sync.before_rollout()  # server mode: the server's health is checked here (restarted if it died)
        # A server lost during the rollout is restarted with the trainer's weights and the step is collected
        # again from the same task state, so its data is whole (bounded: docs/vllm.md#when-the-server-dies).
        next_seed, tasks = self.next_seed, self.tasks.state_dict()

        def play() -> list[Trajectory]:  # from the same task state each time
            self.next_seed = next_seed
            self.tasks.load_state_dict(tasks)
            return self._play(seeds)

        trajectories = play_whole(play, self.generation.recover, episodes=self._played)
        self.sync.before_update()
        release_cached_memory(self.device)  # generation's KV caches: free for the update (and a colocated engine)
        return trajectories

    def _played(self, trajectories: list[Trajectory]) -> list[Trajectory]:
        """Every trajectory of the last rollout: a game's seats of both players, else ``trajectories``."""
        if self.matches is None:
            return trajectories
        from rl_llm.trainers.social import match_seats

        return match_seats(self.matches)

    def play_matches(self, seeds: list[int]) -> list[Any]:
        """``group_size`` matches per seed of a two-player game as the opponents plan says (trainers/social.py);
        the asynchronous generator calls it too, from its own thread (no league there: refused at config)."""
        from rl_llm.trainers.social import play_games

        rollout = self.config.rollout
        league_player = None
        if self.league is not None:  # the weights after step s join as member s (trainers/league.py)
            self.league.update(self.step, self.model)
            league_player = functools.partial(self.league.player, model=self.model, generator=self.generator,
                                              autocast_dtype=self.precision.autocast_dtype,
                                              max_batch_size=rollout.concurrency, seed=self.config.seed)  # fmt: skip
        return play_games(self.config, self.generator, seeds, rollout.group_size, self.opponents.plan,
                          rollout.max_new_tokens, rollout.concurrency, league_player)  # fmt: skip

    def _play(self, seeds: list[int]) -> list[Trajectory]:
        if self.opponents is not None:  # a two-player game: matches, the learner's seats are trained on
            from rl_llm.trainers.social import learner_trajectories

            self.matches = self.play_matches(seeds)
            return learner_trajectories(self.matches)
        # curriculum options per seed, dynamic sampling's refills (trainers/filtering.py)
        trajectories, self.sampling_metrics = collect_step(self, seeds)
        return trajectories

    def score(self, trajectories: list[Trajectory]) -> TrainBatch:
        """The training batch: usable episodes (no error, some policy tokens), scored by their return after
        the OTC transform, down-sampled by PODS, padded and moved to the training device."""
        usable = [t for t in trajectories if t.error is None and t.num_policy_tokens > 0]
        self.dropped = len(trajectories) - len(usable)
        if not usable:
            # A generation server lost under an asynchronous run's generator says so in one line (restarted
            # only where nothing else uses it: docs/vllm.md#when-the-server-dies).
            self.generation.recover(trajectories)
            errors = sorted({t.error or "no policy tokens" for t in trajectories})
            raise RuntimeError(f"no usable episode among {len(trajectories)} this step; errors: {errors[:3]}")
        scores = [t.total_reward for t in usable]
        task_ids = [t.task_id for t in usable]
        if self.otc is not None:
            calls = [int(t.metrics.get(self.config.otc.metric, 0)) for t in usable]
            verdicts = [reported_correct({"metrics": t.metrics}) for t in usable]  # the env's, when it gives one
            scores = self.otc(scores, calls, task_ids, verdicts)
        if self.config.rollout.pods_keep is not None:
            keep = pods_select(scores, task_ids, self.config.rollout.pods_keep)
            usable, scores = [usable[i] for i in keep], [scores[i] for i in keep]
        self.scored = usable
        return collate(usable, self.tokenizer.pad_token_id, scores).to(self.device)

    @property
    def policy_version(self) -> int:
        """The newest weights' version, as published to the generator (which may take them up later: an
        asynchronous hf run's generator swaps them in between two batches)."""
        return self.sync.published_version

    @property
    def reference_fn(self) -> Callable[..., torch.Tensor] | None:
        return None if self.reference is None else self.reference.logprobs

    def log_step(self, step: int, trajectories: Sequence[Trajectory], batch: TrainBatch, stats: dict[str, float],
                 timer: StepTimer, progress: ProgressDisplay, extra: dict[str, float] | None = None) -> None:
        """Record the step (``extra``: more named figures, e.g. the asynchronous loop's), evaluate if due,
        checkpoint if due."""
        self.step = step
        metrics = rollout_metrics(trajectories, batch)
        metrics.update({f"loss/{name}": value for name, value in stats.items()})
        metrics["episode/dropped"] = float(self.dropped)
        metrics.update(self.sampling_metrics)  # groups drawn/kept/dropped, curriculum mix (set by collect)
        metrics.update(timer.metrics())
        if self.device.type == "cuda":  # since the step began (StepTimer), before any evaluation below
            metrics["memory/peak_gpu_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        rollout_s = timer.seconds.get("rollout", 0.0)
        metrics["throughput/policy_tokens_per_s"] = metrics["episode/policy_tokens_total"] / rollout_s if rollout_s else 0.0
        metrics["policy_version"] = self.policy_version
        metrics.update(self.generation.metrics())  # vllm/restarts in server mode
        metrics.update(extra or {})
        if self.matches is not None:
            from rl_llm.trainers.social import step_metrics

            metrics.update(step_metrics(self.matches))
            if self.league is not None:
                metrics["game/league_size"] = float(len(self.league.members))
        metrics["lr"] = self.optimizer.param_groups[0]["lr"]
        every = self.config.eval.every
        if every and step % every == 0 and step < self.config.steps:
            metrics.update({f"eval/{k}": v for k, v in self.evaluate().means().items()})
        self.metrics.log(step, metrics)
        if self.matches is not None:  # both seats of the best and the worst matches (rl-llm view pairs them)
            from rl_llm.trainers.social import sample_matches

            picked = sample_matches(self.matches, self.config.log.samples)
            self.metrics.log_samples(step, picked, len(picked))
        else:
            self.metrics.log_samples(step, trajectories, self.config.log.samples)
        progress.update(step, metrics)
        if step % self.config.log.checkpoint_every == 0 or step == self.config.steps:
            self.save_checkpoint()

    # -- checkpoints --------------------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        tensors: dict[str, Any] = {
            "policy": trainable_state(self.model),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(self.shuffle),
        }
        if self.critic is not None:
            tensors["critic"] = self.critic.state_dict()
            tensors["critic_optimizer"] = self.critic_optimizer.state_dict()
        if self.precision.scaler is not None:  # float16: the loss scales, for an exact resume
            tensors["precision"] = {"policy": self.precision.state_dict(),
                                    "critic": self.critic_precision.state_dict() if self.critic_precision else {}}
        state = {
            "next_seed": self.next_seed,
            "pending_seeds": list(self.pending_seeds),
            "policy_version": self.policy_version,
            "otc_history": self.otc.state_dict() if self.otc else {},
            "curriculum": self.tasks.state_dict(),
            "generation": self.generation.state_dict(),
        }
        if self.league is not None:
            state["league"] = self.league.state_dict()
        path = self.checkpointer.save(self.step, tensors, state)
        if self.league is not None:  # evicted members' files go once the latest checkpoint no longer lists them
            self.league.prune()
        return path

    def _restore(self, path: Path) -> None:
        # Onto the CPU: load_state_dict copies each tensor to its parameter's device, and the optimizer keeps its
        # step counters on the CPU as a fresh one does (mapped to a GPU they would cost a sync per parameter).
        tensors, state = self.checkpointer.load(path, map_location="cpu")
        _, unexpected = self.model.load_state_dict(tensors["policy"], strict=not is_peft(self.model))
        if unexpected:
            raise CheckpointError(f"checkpoint {path} does not fit the model: unexpected keys {unexpected[:5]}")
        self.optimizer.load_state_dict(tensors["optimizer"])
        self.scheduler.load_state_dict(tensors["scheduler"])
        if self.critic is not None:
            self.critic.load_state_dict(tensors["critic"])
            self.critic_optimizer.load_state_dict(tensors["critic_optimizer"])
        scales = tensors.get("precision", {})  # absent unless float16 (or from before loss scaling)
        self.precision.load_state_dict(scales.get("policy", {}))
        if self.critic_precision is not None:
            self.critic_precision.load_state_dict(scales.get("critic", {}))
        restore_rng_state(tensors["rng"], self.shuffle)
        self.step = int(state["step"])
        self.next_seed = int(state["next_seed"])
        self.pending_seeds = [int(seed) for seed in state.get("pending_seeds", [])]
        self._resumed_version = int(state["policy_version"])
        if self.otc is not None:
            self.otc.load_state_dict(state.get("otc_history", {}))
        self.tasks.load_state_dict(state.get("curriculum", {}))
        self._resumed_generation = state.get("generation", {})  # the generator is built after the restore
        if self.league is not None:
            self.league.load_state_dict(state.get("league", {}))

    def _restore_reference(self) -> None:
        """A resumed warm-started run's KL anchor: the warm-started policy saved at its warm start (built from
        model.path, it was the model from before the warm start)."""
        if self.reference is None or not self.config.sft.enabled:
            return
        path = self.run_dir / REFERENCE_FILE
        if not path.is_file():  # a run from before the file was kept
            logger.warning("%s is missing: the KL reference of this resumed run is model.path, not the warm-started "
                           "policy", path)  # fmt: skip
            return
        if self.reference.copy is None:  # LoRA: no copy yet (adapters off); a full run loads into the one it has
            self.reference = FrozenReference.snapshot(self.model)
        self.reference.copy.load_state_dict(torch.load(path, map_location="cpu"))

    # -- evaluation and the end of a run ------------------------------------------------------------------
    def evaluate(self) -> EvalResult:
        config = self.config
        seeds = list(range(config.eval.seed, config.eval.seed + config.eval.episodes))
        self.sync.before_rollout()
        # A generation server lost mid-evaluation is restarted and the evaluation played again (recover).
        if config.game is not None:
            from rl_llm.trainers.social import evaluate_game

            return evaluate_game(config, self.generator, config.rollout.max_new_tokens, config.rollout.concurrency,
                                 recover=self.generation.recover)  # fmt: skip
        return evaluate_llm(self.make_env, self.generator, seeds, config.eval.temperature,
                            config.rollout.max_new_tokens, config.rollout.concurrency,
                            recover=self.generation.recover)  # fmt: skip

    def evaluate_before(self) -> EvalResult:
        """The untrained policy on the held-out seeds, computed once and kept in the run dir for resumes."""
        path = self.run_dir / "eval_before.json"
        if path.exists():
            return EvalResult.load(path)
        if self.step > 0:
            raise RuntimeError(f"{path} is missing but the run resumes at step {self.step}; cannot re-measure it")
        self.phase(f"evaluating the starting policy on {self.config.eval.episodes} held-out seeds")
        result = self.evaluate()
        result.save(path)
        return result

    def phase(self, what: str) -> None:
        """One line as each phase outside the steps begins: with a real model, loading it, warming up a vLLM
        engine or evaluating takes minutes, and a run printed nothing from its directory line to its first step."""
        if self.config.log.progress:
            print(f"[{time.perf_counter() - self._started:6.1f}s] {what}", flush=True)

    def progress(self) -> ProgressDisplay:
        return ProgressDisplay(self.config.steps, self.step, enabled=self.config.log.progress)

    def finish(self, before: EvalResult, started: float) -> dict[str, Any]:
        """Evaluate the trained policy, compare with the untrained one and the baselines, write the summary."""
        config = self.config
        self.phase(f"evaluating the trained policy on {config.eval.episodes} held-out seeds")
        after = self.evaluate()
        after.save(self.run_dir / "eval_after.json")  # per-seed figures, for paired before/after comparisons
        # A game's baselines are the opponents of the evaluation itself (return/<baseline> columns).
        baselines = {} if config.game is not None else evaluate_baselines(config, config.eval.baselines)
        from rl_llm.trainers.sft import untrained_result

        untrained = untrained_result(self.run_dir)  # a warm-started run: `before` is the policy after SFT
        rows = {"untrained policy": before} if untrained is None else {"untrained policy": untrained, "after SFT": before}
        rows[f"trained ({config.algorithm}, {self.step} steps)"] = after
        rows.update(baselines)
        columns = None
        if config.game is not None:
            from rl_llm.trainers.social import comparison_columns

            columns = comparison_columns(config, rows)
        print_comparison(f"{config.env.id}: {config.eval.episodes} held-out seeds from {config.eval.seed}", rows,
                         columns=columns)  # fmt: skip
        records = read_metrics(self.metrics.path)
        if config.log.plot:
            plot_curves(records, self.run_dir / "curves.png", title=f"{config.algorithm} on {config.env.id}")
            plot_comparison(rows, self.run_dir / "comparison.png", title=config.env.id)
        summary = {
            "env_id": config.env.id,
            "algorithm": config.algorithm,
            "steps": self.step,
            "return_before": before.mean("return"),
            "return_after": after.mean("return"),
            "baseline_random": baselines["random"].mean("return") if "random" in baselines else math.nan,
            "eval_seeds": [config.eval.seed, config.eval.seed + config.eval.episodes - 1],
            "before": before.means(),
            "after": after.means(),
            "baselines": {name: result.means() for name, result in baselines.items()},
            "model_path": str(self.model_path),
            "model_recipe": _tiny_recipe(self.model_path),  # the tiny model's pinned recipe (None for others)
            "untrained": None if untrained is None else untrained.means(),  # before the warm start, if any
            "resumed_from_step": self.resumed_from,
            "wall_time_s": time.perf_counter() - started,
            "run_dir": str(self.run_dir),
            "config": asdict(config),
        }
        if config.game is not None:  # the tournament against the game's baselines, before and after
            from rl_llm.trainers.social import exploiter

            summary["game"] = {"exploiter": exploiter(config),
                               "exploitability_before": before.mean("exploitability"),
                               "exploitability_after": after.mean("exploitability")}  # fmt: skip
        if "regret" in after.values:
            summary["regret_before"], summary["regret_after"] = before.mean("regret"), after.mean("regret")
        write_text_atomic(self.run_dir / "summary.json", _json(summary))
        self.metrics.log_summary(self.step, summary, comparison_table(rows, columns))
        self.export_model()
        return summary

    def export_model(self) -> Path:
        """The trained policy as a Hugging Face directory (LoRA merged) next to the logs."""
        target = self.run_dir / "model"
        model = self.model.merge_and_unload() if is_peft(self.model) else self.model
        from transformers.utils import logging as hf_logging

        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # "Writing model shards": a redrawn bar after the run's last lines
        try:
            model.save_pretrained(target)
            self.tokenizer.save_pretrained(target)
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        return target

    def close(self) -> None:
        self.metrics.close()
        self.generation.close()


def rollout_metrics(trajectories: Sequence[Trajectory], batch: TrainBatch) -> dict[str, float]:
    returns = np.array([t.total_reward for t in trajectories], dtype=np.float64)
    turns = [turn for t in trajectories for turn in t.turns]
    groups: dict[int, list[float]] = {}
    for group, score in zip(batch.group_ids.tolist(), batch.scores.tolist(), strict=True):
        groups.setdefault(group, []).append(score)
    metrics = {
        "reward/mean": float(returns.mean()),
        "reward/std": float(returns.std()),
        "reward/min": float(returns.min()),
        "reward/max": float(returns.max()),
        "score/mean": float(batch.scores.mean()),
        "groups/zero_std_frac": float(np.mean([np.ptp(v) == 0 for v in groups.values()])),
        "episode/turns_mean": len(turns) / len(trajectories),
        "episode/invalid_action_frac": float(np.mean([t.invalid_action for t in turns])) if turns else 0.0,
        "episode/policy_tokens_mean": batch.num_policy_tokens / len(batch),
        "episode/policy_tokens_total": float(sum(t.num_policy_tokens for t in trajectories)),
        "episode/sequence_length_mean": float(batch.attention_mask.sum(dim=1).float().mean()),
        "episode/trained": float(len(batch)),
    }
    names = sorted({name for t in trajectories for name in t.metrics})
    for name in names:
        metrics[f"env/{name}"] = float(np.mean([t.metrics.get(name, math.nan) for t in trajectories]))
    return metrics


def _tiny_recipe(path: Path) -> dict[str, Any] | None:
    from rl_llm.agents.tiny import recipe_of

    return recipe_of(path)


def _json(record: dict[str, Any]) -> str:
    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    return json.dumps(clean(record), indent=2)
