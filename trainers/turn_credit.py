"""Turn-level credit: GiGPO and turn-level discounted returns (docs/training.md#turn-level-credit).

The outcome estimators give every policy token of an episode one advantage. Here each turn gets its own,
placed on that turn's policy tokens only (prompt and env tokens stay at 0, as everywhere):

- **Turn-level returns** (``advantage.turn_level``, GRPO family): turn ``t`` of episode ``i`` is credited with
  its return-to-go ``G_it = sum_k>=t gamma^(k-t) r_ik`` (per-turn rewards, ``advantage.gamma``) against the
  estimator's own group baseline and scale, both taken from the episode returns ``R_i = G_i0``:
  GRPO ``(G_it - mean_G R) / (std_G R + eps)``, Dr. GRPO ``G_it - mean_G R``, RLOO ``G_it - mean_{j!=i} R_j``,
  REINFORCE ``G_it``. With ``gamma = 1`` and rewards only at the end this is the outcome estimator exactly; a
  reward earned early no longer credits the turns after it.
- **Turn-level GAE** (``advantage.turn_level`` with ``algorithm: ppo``): GAE over policy tokens where a turn is
  one action: ``advantage.gamma`` and the lambdas apply only between turns (from a turn's last policy token to
  the next turn's first), and inside a turn the discount and lambda are 1. ``ppo.gamma`` is not used then.
- **GiGPO** (``algorithm: gigpo``, Feng et al. 2025, verl-agent): ``A_it = A^E_i + w * A^S_it``. ``A^E`` is the
  GRPO advantage of the episode return. ``A^S`` groups the turns of one episode group that start from the same
  anchor state (the observation the turn answers: the task prompt for the first turn, the previous turn's
  observation after it; or ``state_key``, which an env may put in its step and reset ``info`` and the rollout
  engine records per turn) and compares their discounted returns ``G_it`` (``advantage.gigpo_gamma``, 0.95 as
  in the paper): ``A^S = G_it - mean`` over the anchor group (verl-agent's default ``mean_norm``), or divided by
  the group's std with ``gigpo_scale_by_std``. ``w = advantage.gigpo_weight`` (1 in the paper). Where this
  differs from verl-agent: a turn whose anchor state no other turn of its group shares gets ``A^S = 0`` (no
  relative comparison exists); verl-agent gives such a turn mean 0 and std 1, i.e. its raw discounted return.

Policy tokens of a completion that ended the episode before the env stepped (the context limit) belong to
no turn; they keep the episode's outcome advantage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rl_llm.trainers.advantages import _group_stats, outcome_advantages
from rl_llm.trainers.batch import TrainBatch
from rl_llm.types import TokenRole, Trajectory

ANCHORS = ("observation", "state_key")


@dataclass
class AdvantageConfig:
    """``advantage``: per-turn credit (docs/training.md#turn-level-credit)."""

    turn_level: bool = False  # turn-level returns (GRPO family) / turn-level GAE (ppo)
    gamma: float = 1.0  # the per-turn discount of turn-level returns and GAE
    gigpo_gamma: float = 0.95  # algorithm gigpo: discount of the step-level returns
    gigpo_weight: float = 1.0  # algorithm gigpo: weight of the step-level advantage
    gigpo_anchor: str = "observation"  # observation | state_key (info["state_key"] from the env)
    gigpo_scale_by_std: bool = False  # divide the step-level advantage by its anchor group's std


def check_advantage_config(config: object) -> None:
    from rl_llm.trainers.config import ConfigError  # lazy: config imports this module

    adv: AdvantageConfig = config.advantage  # type: ignore[attr-defined]
    algorithm = config.algorithm  # type: ignore[attr-defined]
    if not 0 <= adv.gamma <= 1 or not 0 <= adv.gigpo_gamma <= 1:
        raise ConfigError("advantage.gamma and advantage.gigpo_gamma must be in [0, 1]")
    if adv.gigpo_anchor not in ANCHORS:
        raise ConfigError(f"advantage.gigpo_anchor: {adv.gigpo_anchor!r} is not one of {list(ANCHORS)}")
    if algorithm == "gigpo" and adv.turn_level:
        raise ConfigError("advantage.turn_level does not combine with algorithm gigpo (its step-level term is "
                          "already per turn)")  # fmt: skip
    if (algorithm == "gigpo" or adv.turn_level) and config.game is not None:  # type: ignore[attr-defined]
        raise ConfigError("algorithm gigpo / advantage.turn_level: two-player games have their own per-round "
                          "credit (social.credit)")  # fmt: skip


def turn_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """Discounted return-to-go of each turn: ``G_t = r_t + gamma * G_{t+1}``."""
    out, running = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out


def turn_rewards(trajectory: Trajectory, score: float) -> list[float]:
    """The per-turn rewards, with a transformed score's difference (OTC) on the last turn, as collate does."""
    rewards = [turn.reward for turn in trajectory.turns]
    if rewards:
        rewards[-1] += score - trajectory.total_reward
    return rewards


def anchors(trajectory: Trajectory, kind: str) -> list[str]:
    """The anchor state of each turn: the text the turn answers, or the env's ``state_key`` where recorded."""
    first = next((m.content for m in trajectory.messages if m.role == "user"), "")
    texts = [first] + [turn.observation for turn in trajectory.turns[:-1]]
    if kind == "state_key":
        keys = [turn.info.get("state_key") for turn in trajectory.turns]
        return [f"key:{k}" if k is not None else f"text:{text}" for k, text in zip(keys, texts, strict=True)]
    return texts


def spread(trajectories: Sequence[Trajectory], per_turn: Sequence[Sequence[float]], outcome: torch.Tensor,
           policy_mask: torch.Tensor) -> torch.Tensor:
    """``[N, T]`` advantages: turn ``t``'s value on its policy tokens, the outcome value on policy tokens outside
    every turn, 0 elsewhere."""
    out = outcome.detach().to("cpu", torch.float32)[:, None].expand(policy_mask.shape).clone()
    for row, (trajectory, values) in enumerate(zip(trajectories, per_turn, strict=True)):
        for turn, value in zip(trajectory.turns, values, strict=True):
            out[row, turn.token_start:turn.token_end] = float(value)
    return out.to(policy_mask.device) * policy_mask.to(torch.float32)


def turn_level_advantages(algorithm: str, trajectories: Sequence[Trajectory], batch: TrainBatch,
                          gamma: float) -> torch.Tensor:
    """Turn-level returns against the outcome estimator's group baseline and scale (module docstring)."""
    scores = batch.scores.detach().to("cpu", torch.float64)
    group_ids = batch.group_ids.detach().cpu()
    outcome = outcome_advantages(algorithm, scores, group_ids)
    scale = torch.ones_like(scores)
    if algorithm == "grpo":
        size, _, std = _group_stats(scores, group_ids)
        scale = torch.where(size == 1, torch.ones_like(std), 1.0 / (std + 1e-6))
    per_turn = []
    for row, trajectory in enumerate(trajectories):
        returns = turn_returns(turn_rewards(trajectory, float(scores[row])), gamma)
        per_turn.append([float(outcome[row] + scale[row] * (g - scores[row])) for g in returns])
    return spread(trajectories, per_turn, outcome, batch.policy_mask)


def step_advantages(trajectories: Sequence[Trajectory], scores: Sequence[float], group_ids: Sequence[int],
                    gamma: float, anchor: str, scale_by_std: bool, eps: float = 1e-6) -> list[list[float]]:
    """GiGPO's step-level advantages ``A^S`` per turn of each trajectory (module docstring)."""
    returns, members = [], {}
    for row, trajectory in enumerate(trajectories):
        returns.append(turn_returns(turn_rewards(trajectory, float(scores[row])), gamma))
        for t, state in enumerate(anchors(trajectory, anchor)):
            members.setdefault((int(group_ids[row]), state), []).append((row, t))
    out = [[0.0] * len(r) for r in returns]
    for cells in members.values():
        if len(cells) < 2:
            continue  # a state seen once has no relative baseline: A^S = 0 (verl-agent: its raw return)
        values = torch.tensor([returns[row][t] for row, t in cells], dtype=torch.float64)
        centred = values - values.mean()
        if scale_by_std:
            centred = centred / (values.std() + eps)
        for (row, t), value in zip(cells, centred.tolist(), strict=True):
            out[row][t] = value
    return out


def gigpo_advantages(trajectories: Sequence[Trajectory], batch: TrainBatch, gamma: float, weight: float,
                     anchor: str, scale_by_std: bool) -> torch.Tensor:
    """GiGPO: the episode's GRPO advantage plus ``weight`` times the step-level advantage, per turn."""
    scores = batch.scores.detach().to("cpu", torch.float64)
    group_ids = batch.group_ids.detach().cpu()
    episode = outcome_advantages("grpo", scores, group_ids)
    steps = step_advantages(trajectories, scores.tolist(), group_ids.tolist(), gamma, anchor, scale_by_std)
    per_turn = [[float(episode[row]) + weight * s for s in row_steps] for row, row_steps in enumerate(steps)]
    return spread(trajectories, per_turn, episode, batch.policy_mask)


def turn_advantages(config: object, trajectories: Sequence[Trajectory], batch: TrainBatch) -> torch.Tensor:
    """The GRPO-family loop's hook: GiGPO or turn-level returns, by the config."""
    adv: AdvantageConfig = config.advantage  # type: ignore[attr-defined]
    if config.algorithm == "gigpo":  # type: ignore[attr-defined]
        return gigpo_advantages(trajectories, batch, adv.gigpo_gamma, adv.gigpo_weight, adv.gigpo_anchor,
                                adv.gigpo_scale_by_std)  # fmt: skip
    return turn_level_advantages(config.algorithm, trajectories, batch, adv.gamma)  # type: ignore[attr-defined]


# -- PPO --------------------------------------------------------------------------------------------------
def turn_ends(trajectories: Sequence[Trajectory], policy_mask: torch.Tensor) -> torch.Tensor:
    """``[N, T]`` bool: the last policy token of each turn (where its reward sits, trainers/batch.py)."""
    from rl_llm.trainers.batch import _reward_positions

    ends = torch.zeros(policy_mask.shape, dtype=torch.bool)
    for row, trajectory in enumerate(trajectories):
        positions = [i for i, role in enumerate(trajectory.token_roles) if role == TokenRole.POLICY]
        if positions:
            ends[row, _reward_positions(trajectory, positions)] = True
    return ends.to(policy_mask.device)


def turn_gae(token_rewards: torch.Tensor, values: torch.Tensor, policy_mask: torch.Tensor, ends: torch.Tensor,
             gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over policy tokens with ``gamma`` and ``lam`` applied only after a turn's last policy token (1 inside
    a turn); returns (advantages, returns) as ``advantages.gae`` does."""
    mask = policy_mask.to(torch.bool)
    rewards = token_rewards.to(torch.float32)
    values = values.detach().to(torch.float32)
    discount = torch.where(ends, torch.tensor(gamma), torch.tensor(1.0)).to(rewards.device)
    decay = torch.where(ends, torch.tensor(gamma * lam), torch.tensor(1.0)).to(rewards.device)
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(rewards.shape[0], dtype=torch.float32, device=rewards.device)
    running = torch.zeros_like(next_value)
    for t in range(rewards.shape[1] - 1, -1, -1):
        active = mask[:, t]
        delta = rewards[:, t] + discount[:, t] * next_value - values[:, t]
        running = torch.where(active, delta + decay[:, t] * running, running)
        next_value = torch.where(active, values[:, t], next_value)
        advantages[:, t] = torch.where(active, running, torch.zeros_like(running))
    return advantages, (advantages + values) * mask


def turn_decoupled_gae(trajectories: Sequence[Trajectory], batch: TrainBatch, values: torch.Tensor, gamma: float,
                       lam_actor: float, lam_critic: float) -> tuple[torch.Tensor, torch.Tensor]:
    """VC-PPO's decoupled lambdas (trainers/advantages.py) with turn-level discounting."""
    ends = turn_ends(trajectories, batch.policy_mask)
    advantages, _ = turn_gae(batch.token_rewards, values, batch.policy_mask, ends, gamma, lam_actor)
    _, returns = turn_gae(batch.token_rewards, values, batch.policy_mask, ends, gamma, lam_critic)
    return advantages, returns
