"""The generated knowledge base: determinism, unambiguous names, and questions whose needed searches are
really needed (checked with the real BM25 index, not only by construction)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_llm.envs.knowledge import TOOL_TASK_KINDS, bundled_kb, generate_kb, search_questions, tool_tasks
from rl_llm.envs.knowledge.bundled import SEARCH_QUESTIONS_PER_HOPS, _bundled_kb
from rl_llm.envs.qa_scoring import normalize_answer
from rl_llm.envs.retrieval import BM25Retriever
from rl_llm.envs.tools import calculate


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return bundled_kb(0, str(tmp_path_factory.mktemp("kb")))


@pytest.fixture(scope="module")
def bm25(bundle):
    return BM25Retriever(bundle.passages)


def test_generation_is_deterministic_and_seed_dependent() -> None:
    assert generate_kb(3).passages() == generate_kb(3).passages()
    assert generate_kb(3).passages() != generate_kb(4).passages()


def test_entity_names_share_no_word_and_passages_mention_only_outgoing_links() -> None:
    kb = generate_kb(1, countries=5, cities=30, companies=40, people=150)
    names = [entity.name for entity in kb.entities.values()]
    words = [word.lower() for name in names for word in name.split()]
    assert len(set(words)) == len(words)
    by_name = {entity.name: entity for entity in kb.entities.values()}
    for entity in kb.entities.values():
        text = kb.passage(entity).text
        mentioned = {name for name in names if name in text and name != entity.name}
        linked = {kb.entities[target].name for target in entity.links.values()}
        assert mentioned == linked, (entity.name, mentioned, linked)
        assert all(by_name[name].id in entity.links.values() for name in mentioned)


def test_bundled_set_has_the_documented_hop_counts_and_is_cached(bundle, tmp_path_factory) -> None:
    counts = {hops: sum(q.optimal_tool_calls == hops for q in bundle.search_questions) for hops in (1, 2, 3)}
    assert counts == SEARCH_QUESTIONS_PER_HOPS
    assert len({q.question for q in bundle.search_questions}) == len(bundle.search_questions)
    assert all(len(q.oracle_queries) == q.optimal_tool_calls for q in bundle.search_questions)
    assert (bundle.directory / "COMPLETE").exists() and bundle.corpus_path.exists()
    reloaded = _bundled_kb.__wrapped__(0, str(bundle.directory.parent))  # read back from the cached files
    assert reloaded.passages == bundle.passages
    assert [q.to_json() for q in reloaded.search_questions] == [q.to_json() for q in bundle.search_questions]
    assert [t.to_json() for t in reloaded.tool_tasks] == [t.to_json() for t in bundle.tool_tasks]


def test_every_oracle_search_retrieves_its_hop_and_the_last_hop_states_the_answer(bundle, bm25) -> None:
    by_title = {p.title: p for p in bundle.passages}
    for question in bundle.search_questions:
        results = bm25.search_batch(list(question.oracle_queries), k=3)
        for query, hits in zip(question.oracle_queries, results):
            assert by_title[query] in [hit.passage for hit in hits], (question.question, query)
        stated = " " + normalize_answer(by_title[question.oracle_queries[-1]].contents) + " "
        assert any(f" {normalize_answer(answer)} " in stated for answer in question.answers), question.question


def test_multi_hop_links_are_only_found_one_hop_at_a_time(bundle, bm25) -> None:
    """A search for hop j never shows the passage of a later hop (at most its name), so the passage stating
    the answer needs all the searches: hops cannot be skipped."""
    for question in bundle.search_questions:
        queries = question.oracle_queries
        for j in range(len(queries) - 1):
            shown = {hit.passage.title for hit in bm25.search(queries[j], k=3)}
            assert not shown & set(queries[j + 1 :]), (question.question, queries[j])


def test_tool_tasks_cover_every_kind_and_their_reference_calls_compute_the_answer(bundle) -> None:
    assert {task.kind for task in bundle.tool_tasks} == set(TOOL_TASK_KINDS)
    for task in bundle.tool_tasks:
        assert task.optimal_tool_calls == len(task.calls) >= 1
        calculator_calls = [c for c in task.calls if c.tool == "calculator"]
        if calculator_calls:
            assert str(calculate(calculator_calls[-1].arguments["expression"])) == task.answers[0]


def test_tool_task_facts_come_from_the_searched_passages(bundle, bm25) -> None:
    """Every number in a calculator expression appears in a passage the reference searches return."""
    for task in bundle.tool_tasks:
        queries = [c.arguments["query"] for c in task.calls if c.tool == "search"]
        expressions = [c.arguments["expression"] for c in task.calls if c.tool == "calculator"]
        if not queries or not expressions:
            continue
        seen = " ".join(hit.passage.text for hits in bm25.search_batch(queries, k=3) for hit in hits)
        numbers = [token for token in expressions[0].replace("abs(", " ").replace(")", " ").split() if token.isdigit()]
        assert numbers and all(number in seen for number in numbers), task.question


def test_question_generation_rejects_bad_hop_counts() -> None:
    with pytest.raises(ValueError, match="hops must be 1, 2 or 3"):
        search_questions(generate_kb(0), {4: 1})
    with pytest.raises(ValueError, match="unknown tool task kind"):
        from rl_llm.envs.knowledge.questions import _tool_task

        _tool_task(generate_kb(0), __import__("numpy").random.default_rng(0), "nope")
    assert len(tool_tasks(generate_kb(0), 2)) == 2 * len(TOOL_TASK_KINDS)


def test_envs_starting_together_on_a_fresh_cache_share_one_build(tmp_path: Path) -> None:
    # Regression: threads of one process used the same temporary file name and the second rename failed.
    from concurrent.futures import ThreadPoolExecutor

    from rl_llm.envs.retrieval.corpus import load_corpus, write_jsonl

    with ThreadPoolExecutor(8) as pool:
        bundles = list(pool.map(lambda _: bundled_kb(1, str(tmp_path)), range(8)))
    assert len({id(bundle) for bundle in bundles}) == 1
    assert len(bundles[0].passages) > 0

    records = [{"id": str(i), "title": "t", "text": "x" * 100} for i in range(200)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: write_jsonl(records, tmp_path / "corpus.jsonl"), range(16)))
    assert len(load_corpus(tmp_path / "corpus.jsonl")) == 200
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")] == []


def test_searching_a_multi_hop_question_verbatim_skips_no_hop(bundle, bm25) -> None:
    """Issue 16: 12/150 two-hop and 12/150 three-hop questions of KB format 2 showed the final hop's passage
    to a verbatim search of the question, so "k hops need k searches" (the OTC optimum) was wrong for them."""
    multi_hop = [q for q in bundle.search_questions if q.optimal_tool_calls > 1]
    results = bm25.search_batch([q.question for q in multi_hop], k=3)
    for question, hits in zip(multi_hop, results):
        shown = {hit.passage.title for hit in hits}
        assert not shown & set(question.oracle_queries[1:]), question.question
