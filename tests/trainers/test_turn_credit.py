"""Turn-level credit (trainers/turn_credit.py) against values worked out by hand: GiGPO's episode- plus
step-level advantage, turn-level returns for the GRPO family, and turn-level GAE for PPO."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rl_llm.trainers.advantages import gae
from rl_llm.trainers.batch import collate
from rl_llm.trainers.config import ConfigError, load_config
from rl_llm.trainers.turn_credit import (
    anchors,
    gigpo_advantages,
    step_advantages,
    turn_gae,
    turn_level_advantages,
    turn_returns,
    turn_rewards,
)
from rl_llm.types import Message, TokenRole, Trajectory, Turn

P, A, E = int(TokenRole.PROMPT), int(TokenRole.POLICY), int(TokenRole.ENV)


def episode(task: str, prompt: str, turns: list[tuple[str, float]], seed: int = 0, keys: list | None = None) -> Trajectory:
    """Two prompt tokens, then per turn two policy tokens and one env token (the observation)."""
    t = Trajectory(env_id="test", task_id=task, seed=seed, messages=[Message("system", "sys"), Message("user", prompt)])
    t.token_ids, t.token_roles, t.logprobs = [1, 2], [P, P], [0.0, 0.0]
    for index, (observation, reward) in enumerate(turns):
        start = len(t.token_ids)
        t.token_ids += [3, 4, 5]
        t.token_roles += [A, A, E]
        t.logprobs += [-1.0, -1.0, 0.0]
        info = {} if keys is None else {"state_key": keys[index]}
        t.turns.append(Turn(action="a", observation=observation, reward=reward, token_start=start,
                            token_end=start + 2, info=info))  # fmt: skip
    return t


def per_turn(advantages: torch.Tensor, row: int, turns: int) -> list[float]:
    """The advantage of each turn of a row, checking that it is the same on both its policy tokens and 0 on the
    prompt and env tokens."""
    values = advantages[row]
    assert values[0] == values[1] == 0.0
    out = []
    for t in range(turns):
        start = 2 + 3 * t
        assert values[start] == values[start + 1]
        assert values[start + 2] == 0.0  # the env token carries nothing
        out.append(float(values[start]))
    return out


def test_turn_returns_discount_per_turn() -> None:
    assert turn_returns([1.0, 0.0, 2.0], 0.5) == [1.5, 1.0, 2.0]
    assert turn_returns([], 0.9) == []


def test_a_transformed_score_moves_the_difference_onto_the_last_turn() -> None:
    t = episode("t", "P", [("s", 1.0), ("", 2.0)])
    assert turn_rewards(t, 2.5) == [1.0, 1.5]  # OTC turned the return 3.0 into 2.5


def test_anchors_are_the_text_each_turn_answers_or_the_env_state_key() -> None:
    t = episode("t", "board0", [("board1", 0.0), ("board2", 0.0), ("", 1.0)], keys=["k0", None, "k2"])
    assert anchors(t, "observation") == ["board0", "board1", "board2"]
    assert anchors(t, "state_key") == ["key:k0", "text:board1", "key:k2"]


def gigpo_example() -> list[Trajectory]:
    return [
        episode("t", "P", [("s1", 0.0), ("", 1.0)]),  # A: return 1
        episode("t", "P", [("s1", 0.0), ("", 0.0)]),  # B: return 0, shares s1 with A
        episode("t", "P", [("s2", 0.0), ("", 1.0)]),  # C: return 1, s2 seen once
        episode("u", "P", [("s1", 0.0), ("", 2.0)], seed=1),  # another task: never grouped with the others
    ]


def test_gigpo_step_advantages_by_hand() -> None:
    trajectories = gigpo_example()
    steps = step_advantages(trajectories, [1.0, 0.0, 1.0, 2.0], [0, 0, 0, 1], gamma=0.5, anchor="observation",
                            scale_by_std=False)  # fmt: skip
    # Discounted returns (gamma 0.5): A (0.5, 1), B (0, 0), C (0.5, 1). Anchor "P" holds the three first turns
    # (mean 1/3); "s1" holds A's and B's second turns (mean 0.5); "s2" only C's (A^S = 0); task u is alone.
    expected = [[1 / 6, 0.5], [-1 / 3, -0.5], [1 / 6, 0.0], [0.0, 0.0]]
    for got, want in zip(steps, expected, strict=True):
        assert got == pytest.approx(want, abs=1e-9)
    scaled = step_advantages(trajectories, [1.0, 0.0, 1.0, 2.0], [0, 0, 0, 1], 0.5, "observation", True)
    # "P": values (0.5, 0, 0.5), unbiased std sqrt(1/12); "s1": (1, 0), std sqrt(1/2).
    assert scaled[0] == pytest.approx([(1 / 6) / math.sqrt(1 / 12), 0.5 / math.sqrt(0.5)], abs=1e-5)


def test_gigpo_adds_the_step_advantage_to_the_episode_grpo_advantage() -> None:
    trajectories = gigpo_example()
    batch = collate(trajectories, pad_token_id=0)
    advantages = gigpo_advantages(trajectories, batch, gamma=0.5, weight=1.0, anchor="observation", scale_by_std=False)
    # Episode level (GRPO over returns 1, 0, 1): mean 2/3, unbiased std sqrt(1/3) -> 1/sqrt(3), -2/sqrt(3),
    # 1/sqrt(3); task u is a group of one: its return, 2.
    a, b = 1 / math.sqrt(3), -2 / math.sqrt(3)
    assert per_turn(advantages, 0, 2) == pytest.approx([a + 1 / 6, a + 0.5], abs=1e-5)
    assert per_turn(advantages, 1, 2) == pytest.approx([b - 1 / 3, b - 0.5], abs=1e-5)
    assert per_turn(advantages, 2, 2) == pytest.approx([a + 1 / 6, a], abs=1e-5)
    assert per_turn(advantages, 3, 2) == pytest.approx([2.0, 2.0], abs=1e-5)
    halved = gigpo_advantages(trajectories, batch, gamma=0.5, weight=0.5, anchor="observation", scale_by_std=False)
    assert per_turn(halved, 1, 2) == pytest.approx([b - 1 / 6, b - 0.25], abs=1e-5)


def test_gigpo_with_state_keys_groups_turns_by_the_env_state() -> None:
    # Same texts, but the env says the first turns of A and B start from different states.
    trajectories = [episode("t", "P", [("s", 0.0), ("", 1.0)], keys=["x", "y"]),
                    episode("t", "P", [("s", 0.0), ("", 0.0)], keys=["z", "y"])]  # fmt: skip
    steps = step_advantages(trajectories, [1.0, 0.0], [0, 0], 1.0, "state_key", False)
    assert steps == [[0.0, 0.5], [0.0, -0.5]]


TWO_TURNS = [episode("t", "P", [("s", 1.0), ("", 1.0)]), episode("t", "P", [("s", 0.0), ("", 1.0)])]


@pytest.mark.parametrize("algorithm, expected", [
    # returns-to-go (gamma 0.5): E1 (1.5, 1), E2 (0.5, 1); episode returns 2 and 1.
    ("grpo", [[0.0, -0.5 / math.sqrt(0.5)], [-1.0 / math.sqrt(0.5), -0.5 / math.sqrt(0.5)]]),  # mean 1.5, std sqrt(.5)
    ("drgrpo", [[0.0, -0.5], [-1.0, -0.5]]),
    ("rloo", [[0.5, 0.0], [-1.5, -1.0]]),  # leave-one-out baselines 1 and 2
    ("reinforce", [[1.5, 1.0], [0.5, 1.0]]),
])  # fmt: skip
def test_turn_level_returns_by_hand(algorithm: str, expected: list[list[float]]) -> None:
    batch = collate(TWO_TURNS, pad_token_id=0)
    advantages = turn_level_advantages(algorithm, TWO_TURNS, batch, gamma=0.5)
    for row, want in enumerate(expected):
        assert per_turn(advantages, row, 2) == pytest.approx(want, abs=1e-5)


def test_turn_level_returns_with_no_discount_and_final_rewards_are_the_outcome_estimator() -> None:
    from rl_llm.trainers.advantages import broadcast, outcome_advantages

    trajectories = [episode("t", "P", [("s", 0.0), ("", r)]) for r in (1.0, 0.0, 0.5)]
    batch = collate(trajectories, pad_token_id=0)
    for algorithm in ("grpo", "drgrpo", "rloo", "reinforce"):
        outcome = broadcast(outcome_advantages(algorithm, batch.scores, batch.group_ids), batch.policy_mask)
        assert torch.allclose(turn_level_advantages(algorithm, trajectories, batch, gamma=1.0), outcome, atol=1e-6)


def test_turn_gae_discounts_only_between_turns() -> None:
    # Tokens: prompt, turn 0 (two policy tokens), env, turn 1 (two policy tokens); rewards on each turn's last.
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0, 2.0]])
    values = torch.tensor([[0.0, 0.1, 0.2, 0.0, 0.3, 0.4]])
    mask = torch.tensor([[False, True, True, False, True, True]])
    ends = torch.tensor([[False, False, True, False, False, True]])
    advantages, returns = turn_gae(rewards, values, mask, ends, gamma=0.5, lam=0.5)
    # t=5: 2 - 0.4 = 1.6; t=4 (inside the turn, no discount): 0.4 - 0.3 + 1.6 = 1.7;
    # t=2: 1 + 0.5 * 0.3 - 0.2 + 0.25 * 1.7 = 1.375; t=1: 0.2 - 0.1 + 1.375 = 1.475.
    assert advantages[0].tolist() == pytest.approx([0, 1.475, 1.375, 0, 1.7, 1.6])
    assert returns[0].tolist() == pytest.approx([0, 1.575, 1.575, 0, 2.0, 2.0])  # one value target per turn
    plain, _ = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert torch.allclose(turn_gae(rewards, values, mask, ends, 1.0, 1.0)[0], plain)


@pytest.mark.parametrize("overrides, message", [
    (["algorithm=gigpo", "advantage.turn_level=true"], "does not combine"),
    (["advantage.gamma=1.5"], "advantage.gamma"),
    (["algorithm=gigpo", "advantage.gigpo_anchor=board"], "gigpo_anchor"),
    (["algorithm=gigpo", "rollout.group_size=1"], "group_size >= 2"),
])  # fmt: skip
def test_bad_turn_credit_settings_are_refused(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides)


QUIET = ["log.tensorboard=false", "log.progress=false", "log.plot=false"]


def test_gigpo_raises_the_held_out_return_of_the_default_job(tmp_path) -> None:
    """The default job (a 4-pull bandit: per-turn rewards, and the same histories recur across a group) with GiGPO."""
    from rl_llm.trainers.cli import train_main

    assert train_main(None, ["steps=5", "eval.episodes=24", "algorithm=gigpo", *QUIET], out=str(tmp_path)) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["return_after"] > summary["return_before"] + 0.5


def test_ppo_turn_level_gae_is_wired_in(tmp_path) -> None:
    """Undiscounted, lambda 1: turn-level GAE is token-level GAE, so the two runs match; a discount changes them."""
    from rl_llm.trainers.cli import train_main
    from rl_llm.trainers.logging import read_metrics

    small = ["algorithm=ppo", "steps=2", "eval.episodes=4", "rollout.group_size=4", "rollout.prompts_per_step=2",
             "eval.baselines=[]", "ppo.lam_actor=1", "ppo.lam_critic=1", "ppo.whiten_advantages=false", *QUIET]

    def losses(name: str, overrides: list[str]) -> list[dict]:
        assert train_main(None, [*small, *overrides], out=str(tmp_path / name)) == 0
        return [{k: v for k, v in r.items() if k.startswith("loss/")} for r in read_metrics(tmp_path / name / "metrics.jsonl")]

    token = losses("token", ["ppo.gamma=1"])
    assert losses("turn", ["advantage.turn_level=true", "advantage.gamma=1"]) == token
    assert losses("discounted", ["advantage.turn_level=true", "advantage.gamma=0.5"]) != token
