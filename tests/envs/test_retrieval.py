"""BM25 (bm25s, cached on disk, memory-mapped), dense retrieval with user-supplied embedders, and the
JSONL corpus / QA loaders."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rl_llm.envs.retrieval import (
    BM25Retriever,
    DenseRetriever,
    HashingEmbedder,
    Passage,
    load_corpus,
    load_qa,
)
from rl_llm.envs.retrieval.base import top_k_indices
from rl_llm.envs.retrieval.corpus import DataFormatError

PASSAGES = [
    Passage("p0", "Marie Curie", "Marie Curie was a physicist and chemist who researched radioactivity."),
    Passage("p1", "Paris", "Paris is the capital of France, on the river Seine."),
    Passage("p2", "Seine", "The Seine is a river flowing through Paris into the English Channel."),
    Passage("p3", "Radium", "Radium was discovered by Marie and Pierre Curie in 1898."),
    Passage("p4", "Bread", "Bread is baked from flour, water and yeast."),
]


def test_bm25_ranks_by_term_overlap_and_drops_passages_without_any() -> None:
    retriever = BM25Retriever(PASSAGES)
    hits = retriever.search("river Seine", k=3)
    assert [h.passage.id for h in hits][:2] == ["p2", "p1"]
    assert all(h.score > 0 for h in hits) and hits[0].score >= hits[1].score
    assert retriever.search("quantum chromodynamics", k=3) == []  # no shared term: no hit
    assert retriever.search("", k=3) == []
    assert len(retriever.search("Curie", k=10)) == 2  # k larger than the matches


def test_bm25_batch_equals_one_by_one() -> None:
    retriever = BM25Retriever(PASSAGES)
    queries = ["Marie Curie radioactivity", "capital of France", "yeast", "nothing matches zzz", "Paris"]
    assert retriever.search_batch(queries, k=2) == [retriever.search(q, k=2) for q in queries]


def test_bm25_rejects_bad_arguments() -> None:
    retriever = BM25Retriever(PASSAGES)
    with pytest.raises(TypeError, match="not one string"):
        retriever.search_batch("Paris", k=1)
    with pytest.raises(ValueError, match="k must be a positive integer"):
        retriever.search("Paris", k=0)
    with pytest.raises(ValueError, match="at least one passage"):
        BM25Retriever([])


def test_bm25_index_is_built_once_cached_and_memory_mapped(tmp_path) -> None:
    first = BM25Retriever(PASSAGES, cache_dir=tmp_path)
    assert first.index_dir is not None and (first.index_dir / "COMPLETE").exists()
    stamp = (first.index_dir / "COMPLETE").stat().st_mtime_ns
    second = BM25Retriever(PASSAGES, cache_dir=tmp_path)
    assert second.index_dir == first.index_dir
    assert (second.index_dir / "COMPLETE").stat().st_mtime_ns == stamp  # loaded, not rebuilt
    assert isinstance(second._model.scores["data"], np.memmap)
    assert second.search_batch(["Seine river", "Curie"], 3) == BM25Retriever(PASSAGES).search_batch(["Seine river", "Curie"], 3)
    opened = BM25Retriever.load(first.index_dir)  # no passages needed in memory
    assert opened.search("yeast", 1)[0].passage == PASSAGES[4]
    changed = BM25Retriever([*PASSAGES, Passage("p5", "Yeast", "Yeast is a fungus.")], cache_dir=tmp_path)
    assert changed.index_dir != first.index_dir  # a different corpus gets its own index
    assert len(list(tmp_path.glob("bm25-*"))) == 2 and not list(tmp_path.glob(".bm25-*"))  # no staging left
    with pytest.raises(FileNotFoundError, match="not a complete BM25 index"):
        BM25Retriever.load(tmp_path)


def test_dense_retrieval_with_a_deterministic_embedder_and_cached_matrix(tmp_path) -> None:
    embedder = HashingEmbedder(dim=256)
    retriever = DenseRetriever(PASSAGES, embedder, cache_dir=tmp_path)
    assert retriever.search("Seine river Paris", 2)[0].passage.id in ("p1", "p2")
    assert retriever.search("flour water yeast", 1)[0].passage.id == "p4"
    cached = DenseRetriever(PASSAGES, embedder, cache_dir=tmp_path)
    assert isinstance(cached.matrix, np.memmap)
    assert cached.search_batch(["radioactivity"], 2) == retriever.search_batch(["radioactivity"], 2)
    with pytest.raises(ValueError, match="embedder_name"):
        DenseRetriever(PASSAGES, lambda texts: np.ones((len(texts), 4)), cache_dir=tmp_path)
    with pytest.raises(ValueError, match="rows"):
        DenseRetriever(PASSAGES, lambda texts: np.ones((1, 4)), batch_size=100)


@pytest.mark.slow  # importing torch and transformers takes ~10 s here; the hashing embedder covers the rest
def test_dense_retrieval_with_a_tiny_locally_built_transformers_encoder(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from rl_llm.envs.retrieval import TransformersEmbedder

    words = sorted({w.strip(".,").lower() for p in PASSAGES for w in p.contents.split()})
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(tmp_path / "vocab.txt"))
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(words) + 5, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64)  # fmt: skip
    model = transformers.BertModel(config)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    embedder = TransformersEmbedder(str(tmp_path / "model"))  # loads the local directory only
    vectors = embedder([PASSAGES[0].contents, PASSAGES[0].contents, "Bread"])
    assert vectors.shape == (3, 32) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.allclose(vectors[0], vectors[1], atol=1e-5)
    retriever = DenseRetriever(PASSAGES, embedder, query_prefix="query: ", passage_prefix="passage: ")
    query = "Who discovered radium?"
    expected = embedder(["passage: " + p.contents for p in PASSAGES]) @ embedder(["query: " + query])[0]
    hits = retriever.search(query, 5)
    assert [h.passage.id for h in hits] == [PASSAGES[i].id for i in np.argsort(-expected, kind="stable")]
    assert np.allclose([h.score for h in hits], np.sort(expected)[::-1], atol=1e-5)


def test_top_k_indices_breaks_ties_by_index() -> None:
    scores = np.array([0.5, 2.0, 2.0, -1.0, 0.5])
    assert top_k_indices(scores, 3).tolist() == [1, 2, 0]
    assert top_k_indices(scores, 10).tolist() == [1, 2, 0, 4, 3]


def test_corpus_and_qa_loaders_accept_the_documented_layouts(tmp_path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in [
        {"id": "a", "title": "T", "text": "body"},
        {"id": "b", "contents": '"Search R1 title"\nsecond body'},
        {"text": "no title or id"},
    ]) + "\n\n")  # fmt: skip
    passages = load_corpus(corpus)
    assert passages[1] == Passage("b", "Search R1 title", "second body")
    assert passages[2] == Passage("2", "", "no title or id")
    qa = tmp_path / "qa.jsonl"
    qa.write_text("\n".join(json.dumps(r) for r in [
        {"question": "Who?", "answers": ["Ann", "Anne"]},
        {"id": "q9", "question": "When", "golden_answers": "1990", "optimal_tool_calls": 2},
    ]))  # fmt: skip
    first, second = load_qa(qa)
    assert first.answers == ("Ann", "Anne") and first.optimal_tool_calls is None
    assert (second.id, second.answers, second.optimal_tool_calls) == ("q9", ("1990",), 2)


@pytest.mark.parametrize(
    ("loader", "content", "message"),
    [
        (load_corpus, '{"id": 1, "text": "x"}\n{not json}\n', r"corpus.jsonl:2: not valid JSON"),
        (load_corpus, '{"id": 1, "text": 5}\n', r":1: a passage needs string 'text'"),
        (load_corpus, '{"id": 1, "text": "a"}\n{"id": 1, "text": "b"}\n', r":2: duplicate passage id '1'"),
        (load_corpus, "\n", r"the corpus is empty"),
        (load_qa, '{"question": "q", "answers": []}\n', r":1: 'answers' must be a non-empty list"),
        (load_qa, '[1, 2]\n', r":1: expected a JSON object, got list"),
        (load_qa, '{"question": "q", "answers": ["a"], "optimal_tool_calls": -1}\n', r"optimal_tool_calls"),
    ],
)
def test_loaders_name_the_file_and_line_of_bad_data(tmp_path, loader, content, message) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text(content)
    with pytest.raises(DataFormatError, match=message):
        loader(path)


def test_sparse_batch_scoring_agrees_with_bm25s_own_retrieval() -> None:
    import bm25s

    from rl_llm.envs.knowledge import bundled_kb
    from rl_llm.envs.retrieval.bm25 import query_tokens

    passages = bundled_kb().passages
    queries = [p.title for p in passages[::7]] + ["the company that employs people", "born born city 1954", "Über-straße ßλ x"]
    for query in queries:
        assert query_tokens(query, "en") == list(bm25s.tokenize([query], stopwords="en", return_ids=False,
                                                                show_progress=False)[0])  # fmt: skip
    retriever = BM25Retriever(passages)
    reference = retriever._model.retrieve([query_tokens(q, "en") or [""] for q in queries], k=5, show_progress=False)
    for row, hits in enumerate(retriever.search_batch(queries, k=5)):
        expected = [s for s in reference.scores[row] if s > 0]
        assert [h.score for h in hits] == pytest.approx(expected, rel=1e-5)
        ids = {h.passage.id for h in hits}
        assert all(passages[int(d)].id in ids for d, s in zip(reference.documents[row], reference.scores[row])
                   if s > 0 and s > (expected[-1] if expected else 0) + 1e-4)  # same docs up to ties at the cut  # fmt: skip
