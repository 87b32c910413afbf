"""Two-player games through the rollout engine (agents/rollout.py, docs/multi-agent.md): one match per job,
each seat its own trajectory with per-round rewards; LLM seats token-in, token-out like single-agent episodes."""

from __future__ import annotations

from collections.abc import Callable

from rl_llm.agents.baselines.social import SOCIAL_BASELINES
from rl_llm.agents.rollout import collect_games
from rl_llm.types import TokenRole, Trajectory
from tests.agents.trajectory_checks import assert_token_bookkeeping

IPD = SOCIAL_BASELINES["prisoners_dilemma_v0"]


def test_baselines_play_both_seats_with_per_round_rewards() -> None:
    matches = collect_games("prisoners_dilemma_v0", IPD["tit_for_tat"](seed=0), [3, 4], 2,
                            players=lambda seed, g: (None, IPD["always_defect"](seed=0)))  # fmt: skip
    assert len(matches) == 4 and [(m[0].seed, m[0].group_index) for m in matches] == [(3, 0), (3, 1), (4, 0), (4, 1)]
    tft, defector = matches[0]
    assert (tft.seat, tft.opponent, defector.seat, defector.opponent) == ("player_0", "always_defect", "player_1", "policy")
    # tit-for-tat is suckered once (0), then both defect (1 each); the defector gets 5 once, then 1s.
    assert [t.reward for t in tft.turns] == [0.0] + [1.0] * 9 and tft.total_reward == 9.0
    assert defector.total_reward == 14.0 and [t.info["round"] for t in tft.turns] == list(range(1, 11))
    assert tft.end_reason == defector.end_reason == "terminated" and tft.metrics["cooperation_rate"] == 0.1
    assert tft.task_id == defector.task_id and tft.group_id == defector.group_id
    assert Trajectory.from_json(tft.to_json()) == tft  # the seat fields survive the JSONL record


def test_a_loss_on_the_other_players_move_lands_on_the_losers_last_turn() -> None:
    ttt = SOCIAL_BASELINES["tictactoe_v0"]
    matches = collect_games("social/tictactoe_v0", ttt["minimax"](seed=0), [0, 1, 2], 1,
                            players=lambda seed, g: (ttt["random"](seed=seed), None))  # fmt: skip
    for first, second in matches:
        assert first.total_reward + second.total_reward == 0.0  # zero-sum: +1 / -1 or a draw
        assert second.total_reward >= 0.0  # minimax never loses
        assert all(t.reward == 0.0 for t in first.turns[:-1]) and all(t.reward == 0.0 for t in second.turns[:-1])
        assert [m.role for m in first.messages][1::2] == ["user"] * len(first.turns)


def test_self_play_llm_seats_are_recorded_token_in_token_out(make_tiny_policy: Callable[..., object]) -> None:
    policy = make_tiny_policy(max_new_tokens=1, temperature=1.0)
    matches = collect_games("prisoners_dilemma_v0", policy, [0], 2, env_kwargs={"num_rounds": 3, "max_retries": 0},
                            action_template="<{}>")  # fmt: skip
    for match in matches:
        assert [t.seat for t in match] == ["player_0", "player_1"] and {t.opponent for t in match} == {"self"}
        for trajectory in match:
            assert trajectory.error is None and len(trajectory.turns) == 3
            assert_token_bookkeeping(trajectory, policy)
            assert trajectory.num_policy_tokens == 3 and TokenRole.ENV in trajectory.token_roles
    # each seat samples its own stream: the two seats of a match do not share their draws
    draws = [[t.action for t in trajectory.turns] for match in matches for trajectory in match]
    assert len({tuple(d) for d in draws}) > 1


def test_an_llm_against_a_baseline_only_records_its_own_tokens(make_tiny_policy: Callable[..., object]) -> None:
    policy = make_tiny_policy(max_new_tokens=2)
    (opponent, learner), = collect_games("prisoners_dilemma_v0", policy, [5], 1, env_kwargs={"num_rounds": 2},
                                         players=lambda seed, g: (IPD["tit_for_tat"](seed=0), None))  # fmt: skip
    assert learner.seat == "player_1" and learner.num_policy_tokens > 0 and opponent.token_ids == []
    assert opponent.turns[0].action == "<A>" and learner.opponent == "tit_for_tat"
