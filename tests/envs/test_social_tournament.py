"""Round-robin tournaments: classical results with asserted margins, baselines, reporting."""

from __future__ import annotations

import json
import math

import pytest
from rich.console import Console

from rl_llm.agents.baselines import make_baseline
from rl_llm.agents.baselines.social import SOCIAL_BASELINES, TitForTat
from rl_llm.agents.llm import LLMPolicy
from rl_llm.agents.policy import Completion, TextPolicy
from rl_llm.agents.tournament import play_matches, print_tournament, run_tournament, write_jsonl
from rl_llm.envs.social.prisoners_dilemma_v0 import PAYOFFS
from rl_llm.types import Message

ROUNDS = 10
ONE_ROUND_GAIN = PAYOFFS.temptation - PAYOFFS.sucker  # what one defection against a cooperator gains
IPD_AGENTS = list(SOCIAL_BASELINES["prisoners_dilemma_v0"])


@pytest.fixture(scope="module")
def ipd():
    return run_tournament("prisoners_dilemma_v0", IPD_AGENTS, seeds=range(3))


def test_always_defect_beats_always_cooperate_head_to_head(ipd) -> None:
    defector, cooperator = ipd.head_to_head("always_defect", "always_cooperate")
    assert defector - cooperator >= 0.9 * ROUNDS * ONE_ROUND_GAIN
    assert ipd.standings["always_cooperate"].exploitability >= 0.9 * ROUNDS * ONE_ROUND_GAIN


def test_tit_for_tat_earns_the_highest_collective_welfare_against_itself(ipd) -> None:
    best = ipd.welfare("tit_for_tat", "tit_for_tat")
    others = [ipd.welfare(a, b) for a in IPD_AGENTS for b in IPD_AGENTS]
    assert best >= max(others) - 1e-9
    assert best == pytest.approx(2 * ROUNDS * PAYOFFS.reward)  # mutual cooperation every round
    assert best - ipd.welfare("always_defect", "always_defect") >= 0.9 * 2 * ROUNDS * (PAYOFFS.reward - PAYOFFS.punishment)


def test_tit_for_tat_is_not_exploited_by_more_than_one_rounds_payoff(ipd) -> None:
    tft, defector = ipd.head_to_head("tit_for_tat", "always_defect")
    assert defector - tft <= ONE_ROUND_GAIN + 1e-9
    standing = ipd.standings["tit_for_tat"]
    assert standing.exploitability <= ONE_ROUND_GAIN + 1e-9
    # ...while a cooperator without retaliation is exploited every round.
    assert ipd.standings["always_cooperate"].exploitability - standing.exploitability >= 0.8 * ROUNDS * ONE_ROUND_GAIN


def test_cooperation_rates_match_the_strategies(ipd) -> None:
    assert ipd.standings["always_cooperate"].cooperation_rate == 1.0
    assert ipd.standings["always_defect"].cooperation_rate == 0.0
    assert 0.0 < ipd.standings["random"].cooperation_rate < 1.0


def test_reciprocators_punish_a_defector_from_the_second_round(ipd) -> None:
    # TFT and grim cooperate once, then defect: 0 + 9 * P; the defector gets T + 9 * P.
    for name in ("tit_for_tat", "grim_trigger"):
        mine, theirs = ipd.head_to_head(name, "always_defect")
        assert mine == pytest.approx(PAYOFFS.sucker + (ROUNDS - 1) * PAYOFFS.punishment)
        assert theirs == pytest.approx(PAYOFFS.temptation + (ROUNDS - 1) * PAYOFFS.punishment)
    # Win-stay-lose-shift alternates A, B against a defector: sucker and punishment in turn.
    mine, _ = ipd.head_to_head("win_stay_lose_shift", "always_defect")
    assert mine == pytest.approx(ROUNDS / 2 * (PAYOFFS.sucker + PAYOFFS.punishment))


def test_returns_agree_with_the_env_metrics_and_baselines_never_act_invalidly() -> None:
    for game, kwargs in [("prisoners_dilemma_v0", {}), ("split_v0", {"num_rounds": 3}),
                         ("trust_and_split_v0", {"num_rounds": 3}),
                         ("trust_and_split_v0", {"variant": "rps", "num_rounds": 3}), ("tictactoe_v0", {})]:
        names = list(SOCIAL_BASELINES[game])
        result = run_tournament(game, names, seeds=[0, 1], env_kwargs=kwargs)
        assert len(result.matches) == len(names) ** 2 * 2
        assert all(match.invalid_actions == (0, 0) for match in result.matches), game
        for match in result.matches:
            assert all(math.isfinite(r) for r in match.returns)


def test_tournament_is_deterministic_given_seeds() -> None:
    names = ["random", "tit_for_tat", "welfare_maximizer"]
    first = run_tournament("split_v0", names, seeds=[3, 4], env_kwargs={"num_rounds": 4})
    second = run_tournament("split_v0", names, seeds=[3, 4], env_kwargs={"num_rounds": 4})
    assert first.matches == second.matches and first.standings == second.standings


def test_split_greedy_exploits_the_welfare_maximizer_and_reciprocity_limits_it() -> None:
    result = run_tournament("split_v0", ["greedy", "welfare_maximizer", "tit_for_tat"], seeds=range(3),
                            env_kwargs={"num_rounds": 5})
    for seed in range(3):  # same seed, same values: cooperators reach the highest welfare of all pairings
        welfare = {m.agents: m.welfare for m in result.matches if m.seed == seed}
        assert welfare["welfare_maximizer", "welfare_maximizer"] >= max(welfare.values()) - 1e-9
        assert welfare["welfare_maximizer", "welfare_maximizer"] > welfare["greedy", "greedy"]
    greedy, giver = result.head_to_head("greedy", "welfare_maximizer")
    assert greedy > giver
    assert result.standings["tit_for_tat"].exploitability < 0.5 * result.standings["welfare_maximizer"].exploitability


def test_trust_and_split_rps_liar_exploits_trust_and_tit_for_tat_limits_it() -> None:
    kwargs = {"variant": "rps", "num_rounds": 6}
    result = run_tournament("trust_and_split_v0", ["welfare_maximizer", "tit_for_tat", "liar"], seeds=range(4),
                            env_kwargs=kwargs)
    # Honest cooperators reach the welfare optimum: 10 coins at 10 points to the winning hand each round.
    assert result.welfare("welfare_maximizer", "tit_for_tat") == pytest.approx(6 * 100)
    trusting, reciprocal = result.standings["welfare_maximizer"], result.standings["tit_for_tat"]
    assert trusting.exploiter == "liar"
    assert reciprocal.exploitability < 0.75 * trusting.exploitability


def test_tictactoe_minimax_never_loses_and_beats_random() -> None:
    result = run_tournament("tictactoe_v0", ["minimax", "random"], seeds=range(4))
    assert all(m.returns[m.agents.index("minimax")] >= 0 for m in result.matches if "minimax" in m.agents)
    minimax, random = result.head_to_head("minimax", "random")
    assert minimax - random >= 1.0
    assert result.standings["minimax"].exploitability <= 0


class Copycat(TextPolicy):
    """An outside agent (as an LLM would be): plays whatever the prompt shows first."""

    def respond(self, conversation: list[Message]) -> str:
        return "<A>"


def test_outside_policies_play_and_are_measured_against_the_exploiters() -> None:
    result = run_tournament("prisoners_dilemma_v0", {"mine": Copycat(), "tft": TitForTat(seed=0)}, seeds=[0],
                            exploiters=["always_defect", "tit_for_tat"])
    assert result.standings["mine"].exploiter == "always_defect"
    assert result.standings["mine"].exploitability == pytest.approx(ROUNDS * ONE_ROUND_GAIN)
    assert {m.agents for m in result.exploiter_matches} >= {("mine", "always_defect"), ("always_defect", "mine")}


def test_an_llm_gets_the_requests_of_all_seeds_as_one_batch() -> None:
    calls: list[int] = []

    class TitForTatLLM(LLMPolicy):
        """A stand-in LLM backend: answers every request as tit-for-tat would, counting its batches."""

        def generate(self, requests):
            calls.append(len(requests))
            return [Completion(TitForTat().respond(request.messages)) for request in requests]

    policy = TitForTatLLM()
    records = play_matches("prisoners_dilemma_v0", (policy, policy), seeds=[0, 1, 2],
                           env_kwargs={"num_rounds": 2})
    assert [r.returns for r in records] == [(6.0, 6.0)] * 3
    assert sum(calls) == 2 * 3 * 2 and max(calls) == 3  # one batch per AEC turn, all seeds at once


def test_tables_and_jsonl(ipd, tmp_path) -> None:
    console = Console(record=True, width=200)
    print_tournament(ipd, console)
    text = console.export_text()
    for name in IPD_AGENTS:
        assert name in text
    assert "exploitability" in text
    path = write_jsonl(ipd, tmp_path / "ipd.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert sum(row["kind"] == "match" for row in rows) == len(ipd.matches)
    assert {row["agent"] for row in rows if row["kind"] == "standing"} == set(IPD_AGENTS)


def test_unknown_names_get_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown social game"):
        run_tournament("poker_v0", ["random"])
    with pytest.raises(ValueError, match="unknown baseline"):
        run_tournament("prisoners_dilemma_v0", ["always_maybe"])
    with pytest.raises(ValueError, match="no baselines"):
        make_baseline("random", "nothing_v0")
