"""Warm start from expert trajectories: supervised fine-tuning on episodes played by an env's own baseline.

The expert (e.g. tic-tac-toe's ``minimax``) plays through the same rollout engine and chat format as RL: the
engine records its answers with the model's tokenizer (``tokenizer=``), each answer's tokens as POLICY tokens.
So an expert episode is an ordinary ``Trajectory`` (PROMPT / POLICY / ENV token roles), padded by the same
``collate`` as a GRPO batch, and the loss is the negative log-likelihood of its POLICY tokens: the model
learns exactly the tokens it will later sample, in the context it will sample them in.

With ``env.action_template`` set (e.g. ``<move>{}</move>``) the expert's answer is stripped to what goes
inside the template, as the RL generator writes only that.

The expert data can also come from a file (``sft.data``: an sft-jsonl file written by ``rl-llm export``, e.g.
the best episodes of an earlier run; ``file_trajectories`` tokenises its messages the same way).

Used by the trainer as a warm-start stage (``sft.episodes > 0`` or ``sft.data`` in the config; ``TrainingRun`` calls
``warm_start`` once, on a fresh run, before GRPO). It records, in ``run_dir/warm_start.json``:
the untrained policy's held-out evaluation (before SFT), the expert NLL per policy token before and after SFT
on held-out expert episodes, and the SFT loss curve. The trainer's own "before" evaluation is then the
warm-started policy's.

Any baseline works as the expert, oracles that read the env's hidden state included (each expert episode is
its own ``EpisodeAgent``); a text baseline's random choices are seeded by (episode seed, turn), so the expert
data is the same whatever the concurrency.
"""

from __future__ import annotations

import copy
import json
import time
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from rl_llm.agents.baselines import make_baseline
from rl_llm.agents.llm import SamplingParams
from rl_llm.agents.policy import EpisodeAgent, EpisodeStart, Policy, TextPolicy, as_completion
from rl_llm.agents.rollout import collect
from rl_llm.trainers.batch import TrainBatch, collate, micro_batches
from rl_llm.trainers.checkpoint import write_text_atomic
from rl_llm.trainers.modeling import is_peft, token_logprobs
from rl_llm.trainers.precision import Precision
from rl_llm.types import Message, Trajectory

if TYPE_CHECKING:
    from rl_llm.trainers.evaluation import EvalResult
    from rl_llm.trainers.runner import TrainingRun

WARM_START_FILE = "warm_start.json"


class Expert(Policy):
    """A baseline as the SFT expert. Its answers are cut to what goes inside ``action_template`` (the env wraps
    the rest, as the RL generator writes only the content). A text baseline (``TextPolicy``) draws each turn
    from ``numpy.random.default_rng([episode seed, turn])``, so the expert data depends on the episode seeds
    alone: not on the baseline's seed, the concurrency or the order of the seeds."""

    def __init__(self, baseline: Policy, action_template: str | None = None) -> None:
        self.baseline = baseline
        self.name = baseline.name
        self.template = action_template if action_template and action_template != "{}" else None

    def start_episode(self, episode: EpisodeStart) -> EpisodeAgent:
        if isinstance(self.baseline, TextPolicy) and episode.seed is not None:
            return _SeededTurns(self, episode)
        return _Expert(self, self.baseline.start_episode(episode))

    def answer(self, text: str) -> str:
        return template_content(text, self.template) if self.template else text


class _Expert(EpisodeAgent):
    def __init__(self, expert: Expert, agent: EpisodeAgent) -> None:
        self.expert, self.agent = expert, agent

    def act(self, conversation: Sequence[Message]) -> str:
        return self.expert.answer(as_completion(self.agent.act(conversation)).text)


class _SeededTurns(EpisodeAgent):
    def __init__(self, expert: Expert, episode: EpisodeStart) -> None:
        self.expert, self.episode = expert, episode

    def act(self, conversation: Sequence[Message]) -> str:
        player = copy.copy(self.expert.baseline)
        player.begin(self.episode)
        if hasattr(player, "rng"):
            turn = sum(message.role == "assistant" for message in conversation)
            seat = [zlib.crc32(self.episode.seat.encode())] if self.episode.seat else []  # game seats: own draws
            player.rng = np.random.default_rng([int(self.episode.seed), turn, *seat])
        return self.expert.answer(player.respond(list(conversation)))


def template_content(text: str, action_template: str) -> str:
    """What goes inside ``action_template`` in ``text`` (its last occurrence); ValueError when it does not fit."""
    prefix, suffix = action_template.split("{}", 1)
    start, end = text.rfind(prefix), text.rfind(suffix)
    if start < 0 or end < start + len(prefix):
        raise ValueError(f"expert answer {text!r} does not fit the action template {prefix}{{}}{suffix}")
    return text[start + len(prefix) : end]


def expert_trajectories(
    make_env: Any,
    tokenizer: Any,
    env_id: str,
    baseline: str,
    seeds: Sequence[int],
    action_template: str | None,
    concurrency: int = 64,
    env_kwargs: dict[str, Any] | None = None,
) -> list[Trajectory]:
    """One expert episode per seed, played by the rollout engine and recorded token-in, token-out with
    ``tokenizer`` like an RL rollout (each answer's tokens as POLICY tokens, log-prob 0). In a two-player
    game (``social/<game>``) the expert plays both seats of one match per seed: two trajectories per seed."""
    if env_id.startswith("social/"):
        from rl_llm.agents.rollout import collect_games

        game = env_id.removeprefix("social/")
        expert = Expert(make_baseline(baseline, game, seed=seeds[0] if seeds else 0), action_template)
        matches = collect_games(env_id, expert, list(seeds), 1, env_kwargs=env_kwargs, concurrency=concurrency,
                                tokenizer=tokenizer, action_template=action_template)  # fmt: skip
        trajectories = [trajectory for match in matches for trajectory in match]
    else:
        expert = Expert(make_baseline(baseline, env_id, seed=seeds[0] if seeds else 0), action_template)
        trajectories = collect(make_env, expert, list(seeds), 1, concurrency=concurrency, tokenizer=tokenizer)
    failed = [t.error for t in trajectories if t.error is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} expert episodes failed, e.g. {failed[0]}")
    return trajectories


def file_trajectories(path: Any, tokenizer: Any, action_template: str | None = None) -> list[Trajectory]:
    """The episodes of an sft-jsonl file (``rl-llm export --format sft-jsonl``; docs/export.md) tokenised with
    ``tokenizer`` exactly as the rollout engine records an expert's episode: the messages before the first
    assistant message as PROMPT tokens, each assistant message's content as its tokens (POLICY when the
    message's ``train`` flag is true or absent, ENV otherwise: context the loss skips), each following message
    as the template's ENV tokens. With an ``action_template`` an answer that holds the template is cut to its
    content, as ``Expert`` does. Episodes with nothing to train on are left out; ValueError when none is left."""
    from rl_llm.agents.chat import ChatFormat
    from rl_llm.export import read_sft_jsonl
    from rl_llm.types import TokenRole, Turn

    chat = ChatFormat(tokenizer)
    template = action_template if action_template and action_template != "{}" else None
    prefix, suffix = template.split("{}", 1) if template else ("", "")
    trajectories = []
    for number, row in enumerate(read_sft_jsonl(path), 1):
        messages = [Message(m["role"], m["content"]) for m in row["messages"]]
        flags = [m.get("train", True) is not False for m in row["messages"]]
        rewards = [float(m.get("reward") or 0.0) for m in row["messages"]]
        first = next((i for i, m in enumerate(messages) if m.role == "assistant"), None)
        if first is None or first == 0:
            continue  # no answer to learn, or no prompt to condition it on
        seed = row.get("seed")
        trajectory = Trajectory(env_id=str(row.get("env_id") or ""), task_id=str(row.get("task_id") or f"line {number}"),
                                seed=seed if isinstance(seed, int) else None, messages=messages[:first])  # fmt: skip

        def add(ids: Sequence[int], role: TokenRole, trajectory: Trajectory = trajectory) -> None:
            trajectory.token_ids += ids
            trajectory.token_roles += [int(role)] * len(ids)
            trajectory.logprobs += [0.0] * len(ids)

        add(chat.prompt_ids(messages[:first]), TokenRole.PROMPT)
        index = first
        while index < len(messages):
            message = messages[index]
            if message.role != "assistant":
                raise ValueError(f"{path}:{number}: two messages in a row after an answer ({message.role!r} at "
                                 f"message {index + 1}); each answer is followed by one observation")  # fmt: skip
            text = message.content
            if template and prefix in text and suffix in text:
                text = template_content(text, template)
            ids = chat.encode(text)
            start = len(trajectory.token_ids)
            add(ids, TokenRole.POLICY if flags[index] else TokenRole.ENV)
            following = messages[index + 1] if index + 1 < len(messages) else None
            trajectory.turns.append(Turn(action=text, observation=following.content if following else "",
                                         reward=rewards[index], token_start=start, token_end=start + len(ids)))  # fmt: skip
            trajectory.messages.append(Message("assistant", text))
            if following is not None:
                add(chat.observation_ids(following.content, ids, following.role), TokenRole.ENV)
                trajectory.messages.append(following)
            index += 2
        if trajectory.num_policy_tokens:
            trajectories.append(trajectory)
    if not trajectories:
        raise ValueError(f"{path}: no episode has an answer to train on (an assistant message with train true)")
    return trajectories


def expert_nll(model: nn.Module, batch: TrainBatch, micro_batch_size: int = 32, precision: Precision | None = None) -> float:
    """Mean negative log-likelihood per policy (expert) token of ``batch`` under ``model``."""
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad(), (precision or Precision()).autocast():
        for indices in micro_batches(torch.arange(len(batch), device=batch.input_ids.device), micro_batch_size):
            sub = batch.select(indices)
            logprobs, _ = token_logprobs(model, sub.input_ids, sub.attention_mask, positions=sub.policy_mask)
            total += float(-(logprobs * sub.policy_mask).sum())
            count += int(sub.policy_mask.sum())
    model.train(was_training)
    return total / max(count, 1)


def sft(
    model: nn.Module,
    batch: TrainBatch,
    epochs: int,
    lr: float,
    batch_size: int,
    micro_batch_size: int,
    max_grad_norm: float,
    seed: int,
    precision: Precision | None = None,
) -> list[float]:
    """Fine-tune ``model`` on the policy tokens of ``batch`` (token-mean NLL per optimizer step).

    Returns the loss of every optimizer step (a step the float16 loss scaler skipped included). A fresh AdamW,
    and a fresh ``precision`` (its own loss scale) when given: the RL optimizer starts clean afterwards.
    """
    precision = precision or Precision()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    shuffle = torch.Generator().manual_seed(seed)
    model.train()
    losses = []
    for _ in range(epochs):
        # drawn on the CPU generator's device, then moved to the batch's (the step's rows index its tensors)
        order = torch.randperm(len(batch), generator=shuffle, device=shuffle.device).to(batch.input_ids.device)
        for step_rows in torch.split(order, batch_size):
            optimizer.zero_grad(set_to_none=True)
            tokens = int(batch.policy_mask[step_rows].sum())
            step_loss = 0.0
            for rows in micro_batches(step_rows, micro_batch_size):
                sub = batch.select(rows)
                with precision.autocast():
                    logprobs, _ = token_logprobs(
                        model, sub.input_ids, sub.attention_mask, positions=sub.policy_mask
                    )
                loss = -(logprobs * sub.policy_mask).sum() / max(tokens, 1)  # token mean over the whole step
                precision.backward(loss)
                step_loss += float(loss.detach())
            precision.step(optimizer, model.parameters(), max_grad_norm)
            losses.append(step_loss)
    optimizer.zero_grad(set_to_none=True)
    return losses


def warm_start(run: TrainingRun) -> dict[str, Any]:
    """The trainer's warm-start stage: evaluate the untrained policy, SFT on expert episodes, record both."""
    from rl_llm.agents.hf import HFPolicy
    from rl_llm.trainers.evaluation import evaluate_llm

    config, started = run.config, time.perf_counter()
    cfg = config.sft
    device = run.device
    # The untrained policy on the held-out seeds, with the hf backend on the trainer's module (no copy).
    sampling = SamplingParams(config.rollout.max_new_tokens, config.rollout.temperature, config.rollout.top_p)
    # The LoRA-injected base model under peft (as the rollout generator takes it): a PeftModel is no
    # PreTrainedModel, and HFPolicy took it for a model path (a LoRA run with a warm start failed there).
    module = run.model.get_base_model() if is_peft(run.model) else run.model
    policy = HFPolicy(module, run.tokenizer, sampling=sampling, seed=config.seed,
                      max_batch_size=config.rollout.concurrency, autocast_dtype=run.precision.autocast_dtype)  # fmt: skip
    eval_seeds = list(range(config.eval.seed, config.eval.seed + config.eval.episodes))
    try:
        if config.game is not None:
            from rl_llm.trainers.social import evaluate_game

            untrained = evaluate_game(config, policy, config.rollout.max_new_tokens, config.rollout.concurrency)
        else:
            untrained = evaluate_llm(run.make_env, policy, eval_seeds, config.eval.temperature,
                                     config.rollout.max_new_tokens, config.rollout.concurrency)  # fmt: skip
    finally:
        policy.close()
    if cfg.data:  # episodes from a file (rl-llm export --format sft-jsonl): the last ones held out
        expert = file_trajectories(cfg.data, run.tokenizer, config.env.action_template)
        if len(expert) <= cfg.held_out_episodes:
            raise ValueError(f"sft.data {cfg.data} has {len(expert)} episodes to train on, not more than "
                             f"sft.held_out_episodes={cfg.held_out_episodes}; lower sft.held_out_episodes")  # fmt: skip
        held = expert[len(expert) - cfg.held_out_episodes :]
        expert = expert[: len(expert) - cfg.held_out_episodes]
        expert = (expert[: cfg.episodes] if cfg.episodes else expert) + held
        n_train = len(expert) - len(held)
        source: dict[str, Any] = {"data": str(cfg.data), "episodes": n_train, "baseline": None}
    else:
        train_seeds = list(range(cfg.seed, cfg.seed + cfg.episodes))
        held_out = list(range(cfg.seed + cfg.episodes, cfg.seed + cfg.episodes + cfg.held_out_episodes))
        # The expert's draws are seeded per (episode seed, turn) (``Expert``); one env plays every episode in
        # turn, as it always has, so that no state an env might keep between episodes can change the data.
        expert = expert_trajectories(run.make_env, run.tokenizer, config.env.id, cfg.baseline, train_seeds + held_out,
                                     config.env.action_template, concurrency=1, env_kwargs=config.env.kwargs)  # fmt: skip
        n_train = len(train_seeds) * (2 if config.game is not None else 1)  # a game: both seats of each match
        source = {"baseline": cfg.baseline, "episodes": cfg.episodes,
                  "expert_seeds": [cfg.seed, cfg.seed + cfg.episodes - 1]}  # fmt: skip
    pad = run.tokenizer.pad_token_id
    train = collate(expert[:n_train], pad).to(device)
    test = collate(expert[n_train:], pad).to(device) if len(expert) > n_train else None
    nll_before = expert_nll(run.model, test, precision=run.precision) if test is not None else float("nan")
    # Its own Precision: a fresh loss scale for the fresh SFT optimizer (the RL loop's stays untouched).
    losses = sft(run.model, train, cfg.epochs, cfg.lr, cfg.batch_size, config.optim.micro_batch_size,
                 config.optim.max_grad_norm, config.seed, Precision(config.model.dtype, device))  # fmt: skip
    nll_after = expert_nll(run.model, test, precision=run.precision) if test is not None else float("nan")
    expert_returns = [t.total_reward for t in expert]
    record = {
        **source,
        "epochs": cfg.epochs,
        "expert_mean_return": sum(expert_returns) / len(expert_returns),
        "expert_policy_tokens": int(train.policy_mask.sum()),
        "heldout_expert_nll_before": nll_before,
        "heldout_expert_nll_after": nll_after,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "losses": losses,
        "untrained": {"seeds": untrained.seeds, "values": untrained.values},
        "untrained_means": untrained.means(),
        "wall_time_s": time.perf_counter() - started,
    }
    write_text_atomic(run.run_dir / WARM_START_FILE, json.dumps(record, indent=2, allow_nan=True))
    return record


def untrained_result(run_dir: Any) -> EvalResult | None:
    """The untrained policy's evaluation from a warm-started run's record (None without a warm start)."""
    from pathlib import Path

    from rl_llm.trainers.evaluation import EvalResult

    path = Path(run_dir) / WARM_START_FILE
    if not path.exists():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))["untrained"]
    return EvalResult(seeds=list(record["seeds"]), values={k: list(v) for k, v in record["values"].items()})
