"""BM25 over a passage corpus with ``bm25s``: built once, cached on disk, loaded memory-mapped.

Scoring uses bm25s's eager index (a token x document matrix of precomputed BM25 term scores) as a scipy
sparse matrix: a batch of queries is one sparse product, and the top k of each query are picked among the
documents sharing a term with it, so a batch costs what its matching postings cost, not queries x corpus.

The cache directory is named by a hash of the passages and the BM25 parameters, so a changed corpus gets a
new index and an unchanged one is never rebuilt. A build writes into a temporary directory that is renamed
into place, so processes that start together never read half an index.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bm25s
import numpy as np
import scipy.sparse
from bm25s.stopwords import STOPWORDS_EN

from rl_llm.envs.retrieval.base import Hit, check_queries, top_k_indices
from rl_llm.envs.retrieval.corpus import Passage, corpus_fingerprint
from rl_llm.envs.retrieval.store import PassageStore, save_passages

INDEX_FORMAT = 1
_COMPLETE_MARKER = "COMPLETE"
# Methods whose score is a plain sum of per-term scores (bm25l / bm25+ also score absent terms).
METHODS = ("lucene", "robertson", "atire")
QUERY_CHUNK = 256  # queries per sparse product: bounds the memory of common-term queries
_TOKEN = re.compile(r"(?u)\b\w\w+\b")  # bm25s's default token pattern


def query_tokens(text: str, stopwords: str | None) -> list[str]:
    """The tokens bm25s's ``tokenize`` gives ``text`` (lower case, its regex, its English stopwords), without
    building a vocabulary per call."""
    drop = _STOPWORDS.get(stopwords or "", frozenset())
    return [token for token in _TOKEN.findall(text.lower()) if token not in drop]


_STOPWORDS = {"en": frozenset(STOPWORDS_EN), "english": frozenset(STOPWORDS_EN)}


class BM25Retriever:
    """Lexical retrieval; ``search_batch`` scores many queries with one sparse product. Thread-safe.

    Arguments: ``k1``, ``b``, ``method`` ("lucene", "robertson" or "atire", bm25s's additive variants),
    ``stopwords`` ("en" or None), ``cache_dir`` (where indexes are kept; None builds in memory only).
    """

    def __init__(
        self,
        passages: Sequence[Passage],
        *,
        k1: float = 1.5,
        b: float = 0.75,
        method: str = "lucene",
        stopwords: str | None = "en",
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if not passages:
            raise ValueError("BM25Retriever needs at least one passage")
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if stopwords not in (None, "en", "english"):
            raise ValueError(f"stopwords must be 'en' or None, got {stopwords!r}")
        self.stopwords = stopwords
        params = {"k1": k1, "b": b, "method": method}
        if cache_dir is None:
            self._model = self._build(passages, params)
            self._passages: Sequence[Passage] | PassageStore = list(passages)
            self.index_dir: Path | None = None
            self._matrix = self._term_matrix()
            return
        key = corpus_fingerprint(passages, INDEX_FORMAT, sorted(params.items()), stopwords)
        self.index_dir = Path(cache_dir) / f"bm25-{key}"
        if not (self.index_dir / _COMPLETE_MARKER).exists():
            self._build_on_disk(passages, params, self.index_dir)
        self._model, self._passages = self._load(self.index_dir)
        self._matrix = self._term_matrix()

    @classmethod
    def load(cls, index_dir: str | os.PathLike[str]) -> BM25Retriever:
        """Open an index built earlier (``retriever.index_dir``) without the passages in memory."""
        index_dir = Path(index_dir)
        if not (index_dir / _COMPLETE_MARKER).exists():
            raise FileNotFoundError(f"{index_dir} is not a complete BM25 index (no {_COMPLETE_MARKER} marker)")
        self = cls.__new__(cls)
        self.stopwords = (index_dir / _COMPLETE_MARKER).read_text().strip() or None
        self.index_dir = index_dir
        self._model, self._passages = self._load(index_dir)
        self._matrix = self._term_matrix()
        return self

    def _build(self, passages: Sequence[Passage], params: dict[str, Any]) -> bm25s.BM25:
        model = bm25s.BM25(**params)
        # Token ids (not strings) make bm25s's index build twice as fast; vocab_dict then maps token -> row.
        tokenized = bm25s.tokenize([p.contents for p in passages], stopwords=self.stopwords, show_progress=False)
        model.index(tokenized, show_progress=False)
        return model

    def _build_on_disk(self, passages: Sequence[Passage], params: dict[str, Any], index_dir: Path) -> None:
        index_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{index_dir.name}.", dir=index_dir.parent))
        try:
            self._build(passages, params).save(staging, show_progress=False)
            save_passages(passages, staging)
            (staging / _COMPLETE_MARKER).write_text(self.stopwords or "")
            try:
                staging.rename(index_dir)
            except OSError:  # another process finished the same index first: use theirs
                if not (index_dir / _COMPLETE_MARKER).exists():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _load(self, index_dir: Path) -> tuple[bm25s.BM25, PassageStore]:
        model = bm25s.BM25.load(index_dir, mmap=True, show_progress=False)
        return model, PassageStore(index_dir)

    def __len__(self) -> int:
        return len(self._passages)

    def search(self, query: str, k: int = 3) -> list[Hit]:
        return self.search_batch([query], k)[0]

    def _term_matrix(self) -> scipy.sparse.csr_matrix:
        """Rows are vocabulary tokens, columns documents; built on the (memory-mapped) bm25s arrays."""
        scores = self._model.scores
        shape = (len(scores["indptr"]) - 1, int(scores["num_docs"]))
        return scipy.sparse.csr_matrix((scores["data"], scores["indices"], scores["indptr"]), shape=shape, copy=False)

    def search_batch(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        queries = check_queries(queries, k)
        results: list[list[Hit]] = []
        for start in range(0, len(queries), QUERY_CHUNK):
            results += self._search_chunk(queries[start : start + QUERY_CHUNK], k)
        return results

    def _search_chunk(self, queries: list[str], k: int) -> list[list[Hit]]:
        vocab = self._model.vocab_dict
        ids = [[vocab[t] for t in query_tokens(query, self.stopwords) if t in vocab] for query in queries]
        rows = np.repeat(np.arange(len(ids)), [len(row) for row in ids])
        columns = np.fromiter((i for row in ids for i in row), dtype=np.int64, count=len(rows))
        weights = np.ones(len(rows), dtype=self._matrix.dtype)  # a repeated query term counts again, as in bm25s
        query_matrix = scipy.sparse.csr_matrix((weights, (rows, columns)), shape=(len(ids), self._matrix.shape[0]))
        scores = (query_matrix @ self._matrix).tocsr()
        scores.sort_indices()  # positions in a row follow document order: ties go to the lower document
        results = []
        for row in range(len(ids)):
            start, end = scores.indptr[row], scores.indptr[row + 1]
            values = scores.data[start:end]
            best = [i for i in top_k_indices(values, k) if values[i] > 0]  # no shared term: not a hit
            results.append([Hit(self._passages[int(scores.indices[start + i])], float(values[i])) for i in best])
        return results

    def close(self) -> None:
        if isinstance(self._passages, PassageStore):
            self._passages.close()

