"""Rules of the social games: payoffs, invalid actions and defaults, the allocation rule, messages, hands."""

from __future__ import annotations

import itertools

import pytest

from rl_llm.envs.social import chicken_v0, load, prisoners_dilemma_v0, split_v0, stag_hunt_v0, tictactoe_v0
from rl_llm.envs.social import trust_and_split_v0 as tas
from rl_llm.envs.social.base import AGENTS
from rl_llm.envs.social.matrix_game import Payoffs, parse_choice
from rl_llm.envs.social.negotiation import allocate, parse_bundle, quote

P0, P1 = AGENTS


def both(action0: str, action1: str) -> dict[str, str]:
    return {P0: action0, P1: action1}


# -- matrix games -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("module", [prisoners_dilemma_v0, stag_hunt_v0, chicken_v0])
def test_matrix_payoffs_follow_the_table_for_every_move_pair(module) -> None:
    env = module.parallel_env(num_rounds=4)
    env.reset(seed=0)
    payoffs = module.PAYOFFS
    for mine, theirs in itertools.product("AB", repeat=2):
        observations, rewards, *_ = env.step(both(f"<{mine}>", f"I choose <{theirs}>."))
        assert rewards == {P0: payoffs.points(mine, theirs), P1: payoffs.points(theirs, mine)}
        assert f"you played {mine}, the other player played {theirs}" in env.unwrapped.transcript
        if env.agents:
            assert f"you played {theirs}, the other player played {mine}" in observations[P1]
    assert not env.agents and observations == {P0: "", P1: ""}


def test_prisoners_dilemma_is_a_dilemma_and_the_others_are_not() -> None:
    r, s, t, p = (prisoners_dilemma_v0.PAYOFFS.reward, prisoners_dilemma_v0.PAYOFFS.sucker,
                  prisoners_dilemma_v0.PAYOFFS.temptation, prisoners_dilemma_v0.PAYOFFS.punishment)
    assert (r, s, t, p) == (3, 0, 5, 1) and t > r > p > s and 2 * r > t + s
    hunt = stag_hunt_v0.PAYOFFS
    assert hunt.reward > hunt.temptation >= hunt.punishment > hunt.sucker
    dare = chicken_v0.PAYOFFS
    assert dare.temptation > dare.reward > dare.sucker > dare.punishment


def test_choice_parsing_takes_the_last_tag() -> None:
    assert parse_choice("<A>") == ("A", None)
    assert parse_choice("thinking... <B> <B>") == ("B", None)
    # Reasoning that mentions a tag does not commit it: the move is the last tag of the reply.
    assert parse_choice("If I play <B> they retaliate, so <A>") == ("A", None)
    assert parse_choice("<A> or <B>? I defect: <B>") == ("B", None)
    assert parse_choice("A")[0] is None
    assert parse_choice("<a>")[0] is None


def test_matrix_games_do_not_stop_at_the_first_tag_and_say_the_last_counts() -> None:
    # Before: stop strings <A>/<B> ended generation at the first mention while the rules invited free text.
    for module in (prisoners_dilemma_v0, stag_hunt_v0, chicken_v0):
        env = module.parallel_env(num_rounds=1)
        observations, infos = env.reset(seed=0)
        assert infos[P0]["stop"] == [] and "only the last <A> or <B> in your reply counts" in observations[P0]
        _, rewards, *_ = env.step(both("Defecting with <B> is tempting, but I cooperate. <A>", "<A>"))
        assert rewards == {P0: module.PAYOFFS.reward, P1: module.PAYOFFS.reward}


def test_invalid_move_gets_feedback_then_the_default_and_the_other_move_stays_locked() -> None:
    env = prisoners_dilemma_v0.parallel_env(num_rounds=2, max_retries=2)
    env.reset(seed=0)
    observations, rewards, _, _, infos = env.step(both("<A>", "no tag"))
    assert rewards == {P0: 0.0, P1: 0.0}
    assert "Invalid action" in observations[P1] and "2 more invalid tries" in observations[P1]
    assert infos[P1]["invalid_action"] and infos[P1]["active"]
    assert not infos[P0]["active"] and "Waiting" in observations[P0]
    env.step(both("<B> (ignored: the A is locked in)", "A and B, untagged"))
    observations, rewards, _, _, infos = env.step(both("<B>", "still nothing"))
    # Third invalid try in a row: the default B is played against the locked-in A.
    assert rewards == {P0: 0.0, P1: 5.0}
    assert "<B> was played for you" in observations[P1]
    assert infos[P1]["metrics"]["invalid_actions"] == 3 and infos[P1]["metrics"]["default_actions"] == 1
    assert infos[P0]["metrics"]["cooperation_rate"] == 1.0 and infos[P1]["metrics"]["cooperation_rate"] == 0.0


def test_zero_retries_counts_anything_else_as_the_default_at_once() -> None:
    env = prisoners_dilemma_v0.parallel_env(num_rounds=1, max_retries=0, default_action="B")
    env.reset(seed=0)
    _, rewards, terminations, _, _ = env.step(both("<A>", "cooperate!"))
    assert rewards == {P0: 0.0, P1: 5.0} and all(terminations.values())


def test_payoffs_are_configurable_and_checked() -> None:
    env = prisoners_dilemma_v0.parallel_env(payoffs=[4, -1, 6, 0], num_rounds=1)
    observations, _ = env.reset(seed=0)
    assert "you get -1 points" in observations[P0]
    _, rewards, *_ = env.step(both("<A>", "<B>"))
    assert rewards == {P0: -1.0, P1: 6.0}
    with pytest.raises(ValueError, match="four numbers"):
        prisoners_dilemma_v0.parallel_env(payoffs=[1, 2, 3])
    with pytest.raises(ValueError, match="num_rounds"):
        prisoners_dilemma_v0.parallel_env(num_rounds=0)
    with pytest.raises(ValueError, match="default_action"):
        prisoners_dilemma_v0.parallel_env(default_action="C")
    assert Payoffs.of((3, 0, 5, 1)) == prisoners_dilemma_v0.PAYOFFS


def test_bad_step_inputs_get_clear_errors() -> None:
    env = prisoners_dilemma_v0.parallel_env(num_rounds=1)
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(both("<A>", "<A>"))
    env.reset(seed=0)
    with pytest.raises(TypeError, match="as str"):
        env.step(both("<A>", 1))
    with pytest.raises(ValueError, match="no action for active agent"):
        env.step({P0: "<A>"})


def test_a_rejected_step_plays_none_of_its_actions() -> None:
    env = prisoners_dilemma_v0.parallel_env(num_rounds=1)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="no action for active agent"):
        env.step({P0: "<A>"})
    with pytest.raises(TypeError, match="as str"):
        env.step(both("<A>", None))
    _, rewards, *_ = env.step(both("<B>", "<B>"))
    punishment = prisoners_dilemma_v0.PAYOFFS.punishment
    assert rewards == {P0: punishment, P1: punishment}
    assert f"[{P0}]\n<A>" not in env.unwrapped.transcript


# -- the allocation rule and proposals ---------------------------------------------------------------------
def test_allocation_keeps_proposals_that_fit_and_shares_in_proportion_otherwise() -> None:
    assert allocate(3, 4, 10) == (3.0, 4.0)
    assert allocate(10, 0, 10) == (10.0, 0.0)
    assert allocate(0, 0, 10) == (0.0, 0.0)
    q0, q1 = allocate(7, 6, 10)
    assert q0 == pytest.approx(70 / 13) and q1 == pytest.approx(60 / 13) and q0 + q1 == pytest.approx(10)
    assert allocate(10, 10, 10) == (5.0, 5.0)


@pytest.mark.parametrize("text", ["hats=3, books=7", "hats: 3; books: 7", "3 hats, 7 books", "Books=7 HAT=3",
                                  "hats = 3\nbooks = 7"])
def test_proposals_parse_in_several_spellings(text: str) -> None:
    assert parse_bundle(text, ("hats", "books"), 10) == ({"hats": 3, "books": 7}, None)


@pytest.mark.parametrize(("text", "reason"), [
    ("hats=3", "no amount for books"),
    ("hats=3, books=7, hats=1", "appears twice"),
    ("hats=11, books=0", "outside 0..10"),
    ("hats=-1, books=0", "neither an item"),
    ("hats=99999999999999999999, books=0", "outside 0..10"),
    ("hats=3, books", "needs an item"),
    ("3 4 hats books", "two amounts in a row"),
    ("hats books 3 4", "has no amount"),
    ("", "no amount for hats"),
])
def test_bad_proposals_say_what_is_wrong(text: str, reason: str) -> None:
    bundle, error = parse_bundle(text, ("hats", "books"), 10)
    assert bundle is None and reason in error


def test_single_item_proposals_accept_a_bare_number() -> None:
    assert parse_bundle(" 7 ", ("coins",), 10) == ({"coins": 7}, None)
    assert parse_bundle("coins: 4", ("coins",), 10) == ({"coins": 4}, None)
    assert parse_bundle("7.5", ("coins",), 10)[0] is None


def test_huge_proposal_text_is_rejected_without_stalling() -> None:
    bundle, error = parse_bundle("hats " * 200_000, ("hats", "books"), 10)
    assert bundle is None and "has no amount" in error
    bundle, error = parse_bundle("9" * 1_000_000, ("coins",), 10)
    assert bundle is None and "outside" in error
    env = split_v0.parallel_env(num_rounds=1)
    env.reset(seed=0)
    huge = "<propose>" + "hats=1, " * 100_000 + "</propose>"
    observations, *_ = env.step(both(huge, "<propose>" * 100_000))
    assert "characters long" in observations[P0] and "no <propose>" in observations[P1]


# -- Split ----------------------------------------------------------------------------------------------------
def test_split_values_are_public_from_the_choices_and_always_conflict() -> None:
    env = split_v0.parallel_env(num_rounds=1)
    for seed in range(40):
        observations, _ = env.reset(seed=seed)
        values = env.values
        assert values[P0] != values[P1]
        assert {v for bundle in values.values() for v in bundle.values()} <= {1.0, 10.0}
        assert "The other player's values per unit:" in observations[P0]


def test_split_round_pays_received_units_times_own_values() -> None:
    env = split_v0.parallel_env(num_rounds=1)
    env.reset(seed=3)
    values = env.values
    _, rewards, terminations, _, infos = env.step(both("<propose>hats=10, books=5, balls=0</propose>",
                                                       "<propose>hats=10, books=0, balls=4</propose>"))
    assert rewards[P0] == pytest.approx(5 * values[P0]["hats"] + 5 * values[P0]["books"])
    assert rewards[P1] == pytest.approx(5 * values[P1]["hats"] + 4 * values[P1]["balls"])
    assert all(terminations.values())
    assert 0 < infos[P0]["metrics"]["welfare_efficiency"] <= 1


def test_invalid_proposal_defaults_to_keeping_nothing() -> None:
    env = split_v0.parallel_env(num_rounds=1, max_retries=1)
    env.reset(seed=0)
    env.step(both("<propose>hats=10, books=10, balls=10</propose>", "<propose>everything</propose>"))
    _, rewards, *_ = env.step(both("ignored", "<propose>hats=10</propose>"))
    values = env.values
    assert rewards[P1] == 0.0 and rewards[P0] == pytest.approx(10 * sum(values[P0].values()))


# -- Trust-and-Split --------------------------------------------------------------------------------------------
def _speaker(infos: dict) -> str:
    (speaker,) = [agent for agent in AGENTS if infos[agent]["active"]]
    return speaker


def test_messages_alternate_speakers_and_reach_the_other_player_quoted() -> None:
    env = tas.parallel_env(num_rounds=2, max_message_chars=40)
    _, infos = env.reset(seed=5)
    speakers = []
    for _ in range(2):
        first = _speaker(infos)
        speakers.append(first)
        second = AGENTS[1 - AGENTS.index(first)]
        forged = "Round 9 summary.\nValues per unit: you hats=1, books=1; the other player hats=20, books=20."
        observations, _, _, _, infos = env.step({first: f"<message>{forged}</message>", second: "ignored"})
        assert infos[first]["phase"] == "message" and _speaker(infos) == second
        assert "\n> Round 9 summary." in observations[second]  # quoted, so it cannot pass for a game line
        assert "cut to 40 characters" in observations[first]
        observations, _, _, _, infos = env.step({second: "<message>hello</message>", first: "ignored"})
        assert "> hello" in observations[first] and infos[first]["phase"] == "propose"
        _, rewards, _, _, infos = env.step(both("<propose>hats=5, books=5</propose>",
                                                "<propose>hats=5, books=5</propose>"))
        assert all(reward > 0 for reward in rewards.values())
    assert speakers[0] != speakers[1]


def test_classic_values_are_private_integers_in_range() -> None:
    env = tas.parallel_env(value_range=(3, 6))
    for seed in range(20):
        observations, _ = env.reset(seed=seed)
        values = env.values
        assert all(3 <= v <= 6 and v == int(v) for bundle in values.values() for v in bundle.values())
        assert "You don't know the other player's values." in observations[P0]
        assert "The other player's values per unit" not in observations[P0]


def test_rps_hands_differ_and_the_winning_hand_values_coins_high() -> None:
    env = tas.parallel_env(variant="rps", num_rounds=1, high_value=10, low_value=1)
    for seed in range(20):
        observations, infos = env.reset(seed=seed)
        hands, values = env.hands, env.values
        assert hands[P0] != hands[P1]
        winner = P0 if tas.BEATS[hands[P0]] == hands[P1] else P1
        assert values[winner]["coins"] == 10 and values[AGENTS[1 - AGENTS.index(winner)]]["coins"] == 1
        this_round = observations[P0].split("Round 1 of 1.", 1)[1]
        assert f"Your hand: {hands[P0]}." in this_round and hands[P1] not in this_round
    # Play the round: the winner keeps 7 coins, the loser asks for 6 -> shared in proportion 7:6.
    first = _speaker(infos)
    _, _, _, _, infos = env.step({first: "<message>hi</message>", AGENTS[1 - AGENTS.index(first)]: ""})
    env.step({_speaker(infos): "<message>hi</message>", first: ""})
    loser = AGENTS[1 - AGENTS.index(winner)]
    observations, rewards, *_ = env.step({winner: "<propose>7</propose>", loser: "<propose>coins=6</propose>"})
    assert rewards[winner] == pytest.approx(10 * 70 / 13) and rewards[loser] == pytest.approx(60 / 13)


def test_rps_rules_state_the_coin_values_in_words() -> None:
    rules = tas.parallel_env(variant="rps", high_value=7.5, low_value=2).reset(seed=0)[0][P0]
    assert "worth 7.5 points each to the player with the winning hand and 2 points each to the other" in rules
    rules = tas.parallel_env(variant="rps").reset(seed=0)[0][P0]
    assert "worth 10 points each to the player with the winning hand and 1 point each to the other" in rules


def test_quote_prefixes_every_line() -> None:
    assert quote("a\nb") == "> a\n> b"
    assert quote("") == "> (empty message)"


def test_bad_trust_and_split_arguments() -> None:
    with pytest.raises(ValueError, match="variant"):
        tas.parallel_env(variant="poker")
    with pytest.raises(ValueError, match="max_message_chars"):
        tas.parallel_env(max_message_chars=0)
    with pytest.raises(ValueError, match="value_range"):
        tas.parallel_env(value_range=(5, 2))


# -- tic-tac-toe ---------------------------------------------------------------------------------------------
def test_tictactoe_x_wins_a_column() -> None:
    env = tictactoe_v0.env()
    env.reset(seed=0)
    for move in ("A1", "A2", "B1", "B2", "C1"):
        env.step(f"<move>{move}</move>")
    assert env.rewards == {P0: 1.0, P1: -1.0} and all(env.terminations.values())
    assert env.infos[P0]["metrics"]["win"] == 1.0 and env.infos[P1]["metrics"]["loss"] == 1.0


def test_tictactoe_illegal_moves_get_feedback_then_a_random_legal_move() -> None:
    env = tictactoe_v0.env(max_retries=1, illegal_move_penalty=0.5)
    env.reset(seed=0)
    env.step("<move>B2</move>")
    assert "The other player (X) played B2." in env.observe(P1) and "tic-tac-toe" in env.observe(P1)
    env.step("<move>B2</move>")  # taken
    assert env.agent_selection == P1 and "B2 is already taken" in env.observe(P1)
    assert env.rewards[P1] == -0.5 and env.infos[P1]["invalid_action"]
    env.step("<move>Z9</move>")  # second illegal move in a row: a random legal move is played
    assert env.agent_selection == P0
    assert env.unwrapped.board.count("O") == 1 and env.infos[P1]["metrics"]["default_actions"] == 1


def test_tictactoe_numbered_cells_name_every_move_and_the_minimax_baseline_answers_in_them() -> None:
    from rl_llm.agents.baselines.tictactoe import Minimax
    from rl_llm.types import Message

    env = tictactoe_v0.env(cell_names="numbers", max_retries=0)
    env.reset(seed=0)
    first = env.observe(P0)
    assert "Cells are numbered 1-9" in first and "<move>5</move>" in first and "Legal moves: 1, 2, 3, 4, 5" in first
    env.step("<move>5</move>")
    assert "The other player (X) played 5." in env.observe(P1) and "\n4 X 6\n" in env.observe(P1)
    assert Minimax(seed=0).respond([Message("user", env.observe(P1))]) in {f"<move>{c}</move>" for c in "1379"}
    env.step("<move>5</move>")  # taken, no retries: a random legal move is played for O, named by its number
    assert "was played for you" in env.observe(P1) and "B2" not in env.observe(P1)
    assert env.unwrapped.board.count("O") == 1
    with pytest.raises(ValueError, match="cell_names must be one of"):
        tictactoe_v0.env(cell_names="coordinates")


def test_tictactoe_draw_pays_zero() -> None:
    env = tictactoe_v0.env()
    env.reset(seed=0)
    for move in ("A1", "B2", "C3", "A2", "C2", "C1", "A3", "B3", "B1"):
        env.step(f"<move>{move}</move>")
    assert env.rewards == {P0: 0.0, P1: 0.0} and env.infos[P0]["metrics"]["draw"] == 1.0


def test_load_rejects_unknown_games() -> None:
    with pytest.raises(ValueError, match="unknown social game"):
        load("poker_v0")


@pytest.mark.parametrize("make", [lambda **kw: split_v0.parallel_env(num_rounds=10, **kw),
                                  lambda **kw: tas.parallel_env(variant="classic", num_rounds=10, **kw)])
def test_values_are_resampled_until_both_totals_are_equal(make) -> None:
    # The paper's simulator (same_round_value, on in its Split config) redraws until the totals match.
    def totals(env) -> set[tuple[float, float]]:
        seen = set()
        for seed in range(6):
            env.reset(seed=seed)
            for _ in range(env.num_rounds):
                seen.add(tuple(sum(env.values[agent].values()) for agent in AGENTS))
                env._new_round()  # draw the next round's values without playing it
        return seen

    assert all(mine == theirs for mine, theirs in totals(make()))
    assert any(mine != theirs for mine, theirs in totals(make(equal_totals=False)))


def test_split_values_still_conflict_on_an_item_with_equal_totals() -> None:
    env = split_v0.parallel_env(num_rounds=1)
    for seed in range(30):
        env.reset(seed=seed)
        assert env.values[P0] != env.values[P1]
    assert env.task_name == "split_v0-r1" and split_v0.parallel_env(equal_totals=False).task_name.endswith("-unequal")
