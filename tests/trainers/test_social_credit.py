"""The two-player credit assignment of trainers/social.py against hand-computed values
(docs/research-protocols.md#social-games): per-round returns, the per-round leave-one-out baseline over a
seed group, Advantage Alignment, the per-seat baseline, and the token layout; plus the game metrics."""

from __future__ import annotations

import pytest
import torch

from rl_llm.trainers.config import ConfigError, load_config
from rl_llm.trainers.social import (
    GAME_PRESETS,
    Match,
    advantage_alignment,
    discounted_returns,
    game_advantages,
    match_advantages,
    resolved,
    rloo_by_round,
    round_rewards,
    step_metrics,
    tit_for_tat_likeness,
    token_advantages,
)
from rl_llm.types import Trajectory, Turn

IPD = ["env.id=social/prisoners_dilemma_v0", "eval.baselines=[always_defect]", "algorithm=rloo"]


def seat(rewards: list[float], name: str = "player_0", seed: int = 0, opponent: str = "self",
         moves: list[tuple[str, str]] | None = None) -> Trajectory:
    """A seat's trajectory: one turn per round (round r at tokens 10r..10r+2), the given rewards."""
    turns = []
    for r, reward in enumerate(rewards, start=1):
        observation = ""
        if moves is not None:
            mine, theirs = moves[r - 1]
            observation = f"Round {r} result: you played {mine}, the other player played {theirs}. You scored 1."
        turns.append(Turn(action="A", observation=observation, reward=reward, token_start=10 * r,
                          token_end=10 * r + 2, info={"round": r}))  # fmt: skip
    return Trajectory(env_id="social/prisoners_dilemma_v0", task_id="t", seed=seed, turns=turns,
                      group_id=f"t|seed={seed}", seat=name, opponent=opponent)  # fmt: skip


def test_discounted_round_returns_with_a_normalising_constant() -> None:
    # r / 2 = [0.5, 0, 1]: G_2 = 1, G_1 = 0 + 0.5 * 1 = 0.5, G_0 = 0.5 + 0.5 * 0.5 = 0.75
    assert discounted_returns([1.0, 0.0, 2.0], gamma=0.5, scale=2.0) == pytest.approx([0.75, 0.5, 1.0])
    assert discounted_returns([], 0.9) == []


def test_rounds_sum_the_turns_of_a_round() -> None:
    trajectory = seat([1.0, 2.0])
    trajectory.turns.insert(1, Turn(action="?", observation="", reward=-0.5, info={"round": 1}))  # a retry
    assert round_rewards(trajectory) == {1: 0.5, 2: 2.0}


def test_rloo_per_round_over_the_members_that_played_the_round() -> None:
    returns = [{1: 3.0, 2: 1.0}, {1: 1.0, 2: 5.0}, {1: 2.0}, {1: 4.0}]
    out = rloo_by_round(returns, ["g", "g", "g", "h"])
    # member 0: round 1 baseline mean(1, 2) = 1.5; round 2 only member 1 played it: 1 - 5
    assert out[0] == pytest.approx({1: 1.5, 2: -4.0})
    assert out[1] == pytest.approx({1: -1.5, 2: 4.0})  # 1 - mean(3, 2); 5 - 1
    assert out[2] == pytest.approx({1: 0.0})  # 2 - mean(3, 1)
    assert out[3] == pytest.approx({1: 4.0})  # alone in its group: baseline 0
    # members of one game never baseline each other (a self-play match's two seats): 0 and 1 are one game
    same_game = rloo_by_round(returns, ["g", "g", "g", "h"], games=[0, 0, 1, 2])
    assert same_game[0] == pytest.approx({1: 1.0, 2: 1.0}) and same_game[1] == pytest.approx({1: -1.0, 2: 5.0})


def test_advantage_alignment_by_hand() -> None:
    # t0: 1; t1: 2 + 0.5 * (0.5 * 1) * (-1) = 1.75; t2: -1 + 0.5 * (0.25 * 1 + 0.5 * 2) * 2 = 0.25
    assert advantage_alignment([1.0, 2.0, -1.0], [0.5, -1.0, 2.0], beta=0.5, gamma=0.5) == pytest.approx([1.0, 1.75, 0.25])
    assert advantage_alignment([1.0, 2.0], [3.0, 4.0], beta=0.0, gamma=0.9) == pytest.approx([1.0, 2.0])


def self_play_matches() -> list[Match]:
    # Two self-play games of one seed. Returns with gamma 0.5: A0 [3, 0], A1 [5.5, 5], B0 [3.5, 5], B1 [1, 0].
    a = (seat([3.0, 0.0], "player_0"), seat([3.0, 5.0], "player_1"))
    b = (seat([1.0, 5.0], "player_0"), seat([1.0, 0.0], "player_1"))
    return [Match(a, (0, 1), "self_play"), Match(b, (0, 1), "self_play")]


def test_match_advantages_rloo_pooled_seats_and_advantage_alignment() -> None:
    base = [*IPD, "social.gamma=0.5", "social.reward_scale=1.0", "social.gamma_aa=1.0", "social.beta=1.0"]
    matches = self_play_matches()
    plain = match_advantages(matches, load_config(None, base))
    (a0, a1), (b0, b1) = (m.seats for m in matches)
    # One group of four (self-play pools the seats): round 1 returns 3, 5.5, 3.5, 1; round 2: 0, 5, 5, 0. Each
    # seat's baseline is the other game's seats (mean 2.25 / 2.5 for game A's, 4.25 / 2.5 for game B's), never its
    # co-player's, whose return its own moves set (with it, a0's baseline was mean(5.5, 3.5, 1) = 10/3).
    assert plain[id(a0)] == pytest.approx({1: 0.75, 2: -2.5})
    assert plain[id(a1)] == pytest.approx({1: 3.25, 2: 2.5})
    assert plain[id(b0)] == pytest.approx({1: -0.75, 2: 2.5})
    assert plain[id(b1)] == pytest.approx({1: -3.25, 2: -2.5})
    aligned = match_advantages(matches, load_config(None, [*base, "social.advantage_alignment=true"]))
    # A0: [0.75, -2.5 + 1 * 0.75 * 2.5]; A1: [3.25, 2.5 + 3.25 * (-2.5)]
    assert aligned[id(a0)] == pytest.approx({1: 0.75, 2: -2.5 + 1.875})
    assert aligned[id(a1)] == pytest.approx({1: 3.25, 2: 2.5 - 8.125})


def test_centred_advantages_subtract_the_batch_mean_of_the_aligned_ones() -> None:
    """Aligned (above), b0 is [-0.75, 2.5 + (-0.75)(-2.5)] and b1 [-3.25, -2.5 + (-3.25)(2.5)]: the eight values
    sum to -12.5 (the Advantage Alignment term's negative mean), so each loses the mean -1.5625; plain RLOO
    sums to zero and centring leaves it as it is."""
    base = [*IPD, "social.gamma=0.5", "social.reward_scale=1.0", "social.gamma_aa=1.0", "social.beta=1.0",
            "social.center_advantages=true"]  # fmt: skip
    matches = self_play_matches()
    (a0, a1), (b0, b1) = (m.seats for m in matches)
    centred = match_advantages(matches, load_config(None, [*base, "social.advantage_alignment=true"]))
    shift = 1.5625
    assert centred[id(a0)] == pytest.approx({1: 0.75 + shift, 2: -0.625 + shift})
    assert centred[id(b0)] == pytest.approx({1: -0.75 + shift, 2: 4.375 + shift})
    assert centred[id(b1)] == pytest.approx({1: -3.25 + shift, 2: -10.625 + shift})
    assert sum(v for a in centred.values() for v in a.values()) == pytest.approx(0.0)
    plain = match_advantages(matches, load_config(None, base))
    assert plain[id(a1)] == pytest.approx({1: 3.25, 2: 2.5})
    with pytest.raises(ConfigError, match=r"center_advantages needs social\.credit=round"):
        load_config(None, [*IPD, "social.credit=outcome", "algorithm=grpo", "social.center_advantages=true"])


def test_role_baseline_groups_each_seat_apart() -> None:
    config = load_config(None, [*IPD, "social.gamma=0.5", "social.reward_scale=1.0", "social.role_baseline=true"])
    matches = self_play_matches()
    out = match_advantages(matches, config)
    (a0, a1), (b0, b1) = (m.seats for m in matches)
    assert out[id(a0)] == pytest.approx({1: -0.5, 2: -5.0}) and out[id(b0)] == pytest.approx({1: 0.5, 2: 5.0})
    assert out[id(a1)] == pytest.approx({1: 4.5, 2: 5.0}) and out[id(b1)] == pytest.approx({1: -4.5, 2: -5.0})


def test_zero_sum_self_play_advantages_cancel_without_the_role_baseline() -> None:
    """TicTacToe-like: player_0 always wins (+1), player_1 loses (-1). Pooled, the seats' advantages are
    +-1 (the other game's seats average 0) and cancel across seats; per seat, both are 0 (nothing to learn from
    a fixed outcome)."""
    games = [Match((seat([1.0], "player_0", seed=0), seat([-1.0], "player_1", seed=0)), (0, 1), "self_play")
             for _ in range(2)]  # fmt: skip
    base = ["env.id=social/tictactoe_v0", "eval.baselines=[random]", "algorithm=rloo"]
    pooled = match_advantages(games, load_config(None, [*base, "social.role_baseline=false"]))
    assert pooled[id(games[0].seats[0])] == pytest.approx({1: 1.0})
    per_seat = match_advantages(games, load_config(None, base))  # the game's preset: role baseline on
    assert all(value == pytest.approx({1: 0.0}) for value in per_seat.values())


def test_against_a_baseline_only_the_learner_seat_is_credited_and_reinforce_has_no_baseline() -> None:
    config = load_config(None, [*IPD, "algorithm=reinforce", "social.gamma=0.5", "social.reward_scale=2.0"])
    learner, opponent = seat([2.0, 4.0], "player_0", opponent="always_defect"), seat([4.0, 0.0], "player_1", opponent="policy")
    out = match_advantages([Match((learner, opponent), (0,), "always_defect")], config)
    assert list(out) == [id(learner)] and out[id(learner)] == pytest.approx({1: 1.0 + 0.5 * 2.0, 2: 2.0})


def test_tokens_of_a_round_share_its_credit() -> None:
    trajectory = seat([1.0, 2.0])
    mask = torch.zeros(1, 24, dtype=torch.bool)
    mask[0, [10, 11, 20, 21]] = True
    out = token_advantages([trajectory], [{1: 0.5, 2: -2.0}], mask)
    expected = torch.zeros(1, 24)
    expected[0, 10:12], expected[0, 20:22] = 0.5, -2.0
    assert torch.equal(out, expected)
    trajectory.turns[1].invalid_action = True  # a penalty on the invalid turn only
    expected[0, 20:22] = -2.5
    assert torch.equal(token_advantages([trajectory], [{1: 0.5, 2: -2.0}], mask, invalid_penalty=0.5), expected)
    trajectory.turns[0].invalid_action = True  # invalid_credit=penalty: -penalty alone, not the round's credit
    expected[0, 10:12], expected[0, 20:22] = -0.5, -0.5
    out = token_advantages([trajectory], [{1: 0.5, 2: -2.0}], mask, invalid_penalty=0.5, invalid_shares_round=False)
    assert torch.equal(out, expected)
    config = load_config(None, [*IPD, "social.invalid_credit=penalty", "social.invalid_penalty=0.5"])
    assert torch.equal(game_advantages([trajectory], [], config, mask, torch.zeros(1)), expected)
    with pytest.raises(ConfigError, match="invalid_credit: 'none' is not one of"):
        load_config(None, [*IPD, "social.invalid_credit=none"])


def test_outcome_credit_uses_the_algorithms_estimator_per_seed_group() -> None:
    config = load_config(None, [*IPD, "algorithm=grpo", "social.credit=outcome"])
    trajectories = [seat([1.0]), seat([3.0])]
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[:, 10] = True
    out = game_advantages(trajectories, [], config, mask, torch.tensor([1.0, 3.0]))
    # GRPO over one group: (R - 2) / std([1, 3]) = -+ 1 / sqrt(2)
    assert out[:, 10].tolist() == pytest.approx([-(2**-0.5), 2**-0.5], rel=1e-5)


def test_presets_are_the_papers_values() -> None:
    assert resolved(load_config(None, IPD)) == GAME_PRESETS["prisoners_dilemma_v0"]
    assert resolved(load_config(None, IPD))["reward_scale"] == 5.0 and GAME_PRESETS["trust_and_split_v0"]["beta"] == 2.0
    assert resolved(load_config(None, [*IPD, "social.beta=3.0"]))["beta"] == 3.0


def test_tit_for_tat_likeness_and_step_metrics() -> None:
    tft = seat([0.0, 5.0, 3.0], moves=[("A", "B"), ("B", "A"), ("A", "A")])
    assert tit_for_tat_likeness(tft) == 1.0  # B after their B, A after their A
    assert tit_for_tat_likeness(seat([0.0, 0.0], moves=[("A", "B"), ("A", "B")])) == 0.0
    tft.metrics["cooperation_rate"] = 2 / 3
    other = seat([5.0, 0.0, 3.0], "player_1", moves=[("B", "A"), ("A", "B"), ("A", "A")])
    other.metrics["cooperation_rate"] = 2 / 3
    metrics = step_metrics([Match((tft, other), (0,), "tit_for_tat")])
    assert metrics["game/return_player_0"] == 8.0 and metrics["game/return_player_1"] == 8.0
    assert metrics["game/welfare"] == 16.0 and metrics["game/learner_return"] == 8.0
    assert metrics["game/cooperation_rate"] == pytest.approx(2 / 3) and metrics["game/tit_for_tat_likeness"] == 1.0
    assert metrics["game/self_play_frac"] == 0.0
