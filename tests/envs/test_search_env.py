"""Search-v0: the oracle solves the whole bundled set, the protocol rewards match hand-computed values,
and malformed actions get specific corrective observations."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import rl_llm  # noqa: F401
from rl_llm.agents.baselines.search import SearchOracle
from rl_llm.envs.knowledge import bundled_kb
from rl_llm.envs.search.protocols import (
    is_valid_search_r1_sequence,
    last_boxed,
    r1_searcher_stage1,
    r1_searcher_stage2,
    research_reward,
    search_r1_em_format,
)
from tests.envs.helpers_search import play_task

GOLD = ("Marie Curie",)
INFO = "\n\n<information>Doc 1(Title: Radium) Radium was discovered by Marie Curie.\n</information>\n\n"


@pytest.mark.parametrize(
    ("protocol", "reward", "best"),
    [("search_r1", "em", 1.0), ("search_r1", "em_format", 1.0), ("r1_searcher", "r1_searcher_stage1", 2.0),
     ("r1_searcher", "r1_searcher_stage2", 1.0), ("research", "research", 1.0), ("research", "f1", 1.0)],
)  # fmt: skip
def test_oracle_solves_every_bundled_question_with_exactly_the_needed_searches(protocol, reward, best) -> None:
    env = gym.make("rl-llm/Search-v0", protocol=protocol, reward=reward)
    oracle = SearchOracle()
    tasks = env.unwrapped.tasks
    indices = range(len(tasks)) if (protocol, reward) == ("search_r1", "em") else range(0, len(tasks), 15)
    for index in indices:
        result = play_task(env, oracle, index)
        assert result["terminated"] and result["metrics"]["correct"] == 1.0, tasks[index].question
        assert result["return"] == pytest.approx(best)
        assert result["metrics"]["tool_calls"] == tasks[index].optimal_tool_calls
        assert result["metrics"]["invalid_actions"] == 0 and result["metrics"]["retrieval_hit"] == 1.0


def test_search_r1_format_reward_table() -> None:
    valid_correct = f"<think>a</think><search>radium</search>{INFO}<think>b</think>\n<answer> marie curie </answer>"
    assert is_valid_search_r1_sequence(valid_correct)
    assert search_r1_em_format(valid_correct, "marie curie", GOLD) == 1.0
    assert search_r1_em_format("<answer>Marie Curie</answer>", "Marie Curie", GOLD) == pytest.approx(0.8)
    valid_wrong = valid_correct.replace("marie curie </answer>", "Pierre </answer>")
    assert search_r1_em_format(valid_wrong, "Pierre", GOLD) == pytest.approx(0.3)  # gold was retrieved
    no_gold = valid_wrong.replace("Marie Curie", "someone")
    assert search_r1_em_format(no_gold, "Pierre", GOLD) == pytest.approx(0.2)
    assert search_r1_em_format("text <answer>Pierre</answer>", "Pierre", GOLD) == pytest.approx(0.1)
    assert search_r1_em_format("<think>a</think>", None, GOLD) == 0.0
    for invalid in ("<think>a</think>stray<answer>x</answer>", "<search>q</search><answer>x</answer>",
                    "<think>a<think>b</think></think><answer>x</answer>", "<think>a</think><answer>x</answer> tail"):
        assert not is_valid_search_r1_sequence(invalid), invalid  # fmt: skip


def test_r1_searcher_stage_rewards() -> None:
    docs = "\n\n<|begin_of_documents|>\n(1)Radium: found by Marie Curie\n<|end_of_documents|>\n\n"
    good = f"<think> look up <|begin_of_query|> radium <|end_of_query|>{docs}so </think>\n\n<answer> Marie Curie </answer>"
    assert r1_searcher_stage1(good, "Marie Curie", GOLD) == 2.0
    assert r1_searcher_stage1("</think><answer>Rome</answer>", "Rome", GOLD) == -0.5  # wrong, no retrieval
    assert r1_searcher_stage1("<think>x</think><answer>Curie, Marie</answer>", "Curie, Marie", GOLD) == 1.5  # cover EM
    assert r1_searcher_stage2(good, "Marie Curie", GOLD) == 1.0
    partial = good.replace("<answer> Marie Curie", "<answer> Curie Pierre")
    assert r1_searcher_stage2(partial, "Curie Pierre", GOLD) == pytest.approx(0.5)
    long_answer = "one two three four five six seven eight nine ten Marie Curie"
    assert r1_searcher_stage2(good.replace("Marie Curie </answer>", long_answer + " </answer>"), long_answer,
                              GOLD) == pytest.approx(2 * (2 / 12) / (2 / 12 + 1) - 2)  # fmt: skip
    assert r1_searcher_stage2("</think> no answer", None, GOLD) == -2.0


def test_research_reward() -> None:
    result = "<result>Doc 1(Title: Radium) ...</result>"
    good = f"<think>a</think> <search>radium</search> {result} <think>b</think> <answer>The final answer is \\[ \\boxed{{Marie Curie}} \\]</answer>"
    assert research_reward(good, last_boxed(good), GOLD) == 1.0
    assert research_reward(good, "Curie", GOLD) == pytest.approx(2 / 3)
    assert research_reward(good, "Pierre", GOLD) == pytest.approx(0.1)
    assert research_reward(good, "Marie Curie", GOLD, finished=False) == 0.0
    assert research_reward(good.replace(result, ""), "Marie Curie", GOLD) == 0.0  # search without a result
    assert research_reward("<answer>\\boxed{Marie Curie}</answer>", "Marie Curie", GOLD) == 0.0  # no think
    assert last_boxed("x \\boxed{a {b} c} y") == "a {b} c" and last_boxed("\\boxed{open") is None


@pytest.fixture
def env():
    env = gym.make("rl-llm/Search-v0", max_turns=4)
    env.reset(seed=0)
    return env


@pytest.mark.parametrize(
    ("action", "reason"),
    [("The answer is probably Paris.", "there was no complete search or answer tag"),
     ("<search>who founded it", "the <search> tag was not closed with </search>"),
     ("<answer>Paris", "the <answer> tag was not closed with </answer>"),
     ("<search>   </search>", "the search query is empty"),
     ("<search>" + "x " * 600 + "</search>", "the search query is over 1000 characters")],
)  # fmt: skip
def test_malformed_actions_get_a_specific_corrective_observation(env, action, reason) -> None:
    observation, reward, terminated, _, info = env.step(action)
    assert observation.startswith("\nMy previous action is invalid: " + reason)
    assert "<search> and </search>" in observation and "<answer> and </answer>" in observation
    assert info["invalid_action"] and not terminated and reward == 0.0
    assert info["metrics"]["invalid_actions"] == 1 and info["metrics"]["tool_calls"] == 0
    assert info["metrics"]["retrieval_hit"] == 0.0


def test_fifty_searches_in_one_turn_run_only_the_first_and_say_so(env) -> None:
    name = env.unwrapped.current_task.oracle_queries[0]
    observation, _, _, _, info = env.step(f"<search>{name}</search>" * 50)
    assert info["metrics"]["tool_calls"] == 1 and not info["invalid_action"]
    assert "49 more in that turn were ignored" in observation and observation.count("<information>") == 1
    assert f"(Title: {name})" in observation


def test_running_out_of_turns_scores_as_unanswered(env) -> None:
    results = [env.step("<search>anything at all</search>") for _ in range(4)]
    assert "last search" in results[2][0]
    observation, reward, terminated, truncated, info = results[-1]
    assert truncated and not terminated and observation == "" and reward == 0.0
    assert info["metrics"]["answered"] == 0.0 and info["metrics"]["tool_calls"] == 4


def test_first_action_of_a_turn_wins_and_the_answer_terminates(env) -> None:
    task = env.unwrapped.current_task
    _, reward, terminated, _, info = env.step(f"<answer>{task.answers[0]}</answer><search>x</search>")
    assert terminated and reward == 1.0 and info["answer"] == task.answers[0]
    assert info["metrics"]["f1"] == 1.0 and info["metrics"]["tool_calls"] == 0


def test_results_are_cut_inside_the_information_block() -> None:
    env = gym.make("rl-llm/Search-v0", max_passage_chars=300, top_k=5)
    env.reset(seed=1)
    observation = env.step(f"<search>{env.unwrapped.current_task.oracle_queries[0]} born city company</search>")[0]
    assert len(observation) < 420 and "characters truncated" in observation
    assert observation.strip().startswith("<information>") and observation.strip().endswith("</information>")


def test_user_corpus_and_questions_with_f1_reward(tmp_path) -> None:
    corpus, qa = tmp_path / "corpus.jsonl", tmp_path / "qa.jsonl"
    corpus.write_text("\n".join(json.dumps({"id": str(i), "title": t, "text": x}) for i, (t, x) in enumerate(
        [("Radium", "Radium was discovered by Marie Curie and Pierre Curie."), ("Paris", "Paris is in France.")])))
    qa.write_text(json.dumps({"question": "Who discovered radium", "answers": ["Marie Curie"]}) + "\n")  # fmt: skip
    env = gym.make("rl-llm/Search-v0", corpus=str(corpus), qa=str(qa), reward="f1", cache_dir=str(tmp_path / "cache"))
    observation, info = env.reset(seed=0)
    assert observation == "Question: Who discovered radium?" and "optimal_tool_calls" not in info
    assert "Doc 1(Title: Radium)" in env.step("<search>radium discovered</search>")[0]
    _, reward, terminated, _, info = env.step("<answer>Curie</answer>")
    assert terminated and reward == pytest.approx(2 / 3) and info["metrics"]["correct"] == 0.0


def test_arguments_are_checked() -> None:
    for kwargs, message in [({"protocol": "nope"}, "protocol must be one of"), ({"reward": "nope"}, "reward must be"),
                            ({"top_k": 0}, "top_k"), ({"corpus": "x.jsonl"}, "both corpus and qa"),
                            ({"hops": (7,)}, "no questions left"), ({"retriever": "tfidf"}, "retriever must be")]:
        with pytest.raises(ValueError, match=message):
            gym.make("rl-llm/Search-v0", **kwargs)  # fmt: skip
    env = gym.make("rl-llm/Search-v0", hops=(3,))
    assert all(task.optimal_tool_calls == 3 for task in env.unwrapped.tasks)
    with pytest.raises(ValueError, match="task_index"):
        env.reset(options={"task_index": 10_000})


def _play_turns(env: gym.Env, index: int, turns: list[str]) -> float:
    env.reset(options={"task_index": index})
    total = 0.0
    for turn in turns:
        _, reward, terminated, truncated, _ = env.step(turn)
        total += reward
        if terminated or truncated:
            break
    return total


def test_r1_searcher_think_rule_holds_per_turn_in_a_chat() -> None:
    """Issue 16: counting <think> over the whole episode made thinking in every turn (as the prompt asks)
    cost 2 points, while one think held open across turns scored full marks."""
    env = gym.make("rl-llm/Search-v0", protocol="r1_searcher", reward="r1_searcher_stage2").unwrapped
    assert "Start every turn with <think>" in env.reset(options={"task_index": 0})[1]["system_prompt"]
    index = next(i for i, t in enumerate(env.tasks) if t.optimal_tool_calls == 2)
    task = env.tasks[index]
    q_open, q_close = env.protocol.search_tags
    per_turn = [f"<think> look up {q} </think>\n{q_open} {q} {q_close}" for q in task.oracle_queries]
    per_turn.append(f"<think> done </think>\n\n<answer> {task.answers[0]} </answer>")
    assert _play_turns(env, index, per_turn) == 1.0
    held_open = [f"<think> look up {task.oracle_queries[0]} {q_open} {task.oracle_queries[0]} {q_close}",
                 f"{q_open} {task.oracle_queries[1]} {q_close}", f"done </think>\n\n<answer> {task.answers[0]} </answer>"]  # fmt: skip
    assert _play_turns(env, index, held_open) == -1.0, "a turn without its own </think> breaks the per-turn rule"
    stage1 = gym.make("rl-llm/Search-v0", protocol="r1_searcher", reward="r1_searcher_stage1").unwrapped
    assert _play_turns(stage1, index, per_turn) == 2.0
    assert _play_turns(stage1, index, held_open) == 1.5
    # Without turns the paper's single-sequence rule applies: one prefilled think across the retrievals.
    docs = "\n\n<|begin_of_documents|>\n(1)Radium: discovered by Marie Curie\n<|end_of_documents|>\n\n"
    single = f"<think> q <|begin_of_query|> radium <|end_of_query|>{docs}so </think>\n\n<answer> Marie Curie </answer>"
    assert r1_searcher_stage1(single, "Marie Curie", GOLD) == 2.0
    assert r1_searcher_stage1(single, "Marie Curie", GOLD, turns=[single]) == 2.0


def test_stage1_cover_em_takes_a_list_unless_the_answer_length_rule_is_on() -> None:
    countries = " ".join(p.title for p in bundled_kb(0).passages if p.id.startswith("country"))
    assert len(countries.split()) == 8
    plain = gym.make("rl-llm/Search-v0", protocol="r1_searcher", reward="r1_searcher_stage1").unwrapped
    short = gym.make("rl-llm/Search-v0", protocol="r1_searcher", reward="r1_searcher_stage1", max_answer_words=3)
    index = next(i for i, t in enumerate(plain.tasks) if "which country" in t.question.lower())
    task = plain.tasks[index]
    q_open, q_close = plain.protocol.search_tags
    searches = [f"<think> look up {q} </think>\n{q_open} {q} {q_close}" for q in task.oracle_queries]
    listing = [*searches, f"<think> all of them </think>\n\n<answer> {countries} </answer>"]
    wrong = [*searches, "<think> guess </think>\n\n<answer> Atlantis </answer>"]
    oracle = [*searches, f"<think> found </think>\n\n<answer> {task.answers[0]} </answer>"]
    assert _play_turns(plain, index, listing) == _play_turns(plain, index, oracle) == 2.0  # R1-Searcher's cover-EM
    assert _play_turns(short.unwrapped, index, listing) == _play_turns(short.unwrapped, index, wrong) == 0.0
    assert _play_turns(short.unwrapped, index, oracle) == 2.0
    with pytest.raises(ValueError, match="max_answer_words"):
        gym.make("rl-llm/Search-v0", reward="em", max_answer_words=3)
