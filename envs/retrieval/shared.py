"""Retrievers as the envs use them: one shared BM25 index per corpus and process, retriever specs
(``"bm25"``, a server URL or an object) resolved to a ``Retriever``, and a search whose failure becomes text
for the agent. Used by Search-v0 and the ToolCalls ``search`` tool."""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from typing import Any

from rl_llm.envs.retrieval.base import RetrievalError, Retriever
from rl_llm.envs.retrieval.bm25 import BM25Retriever
from rl_llm.envs.retrieval.client import RetrieverClient
from rl_llm.envs.retrieval.corpus import load_corpus
from rl_llm.paths import cache_dir as package_cache_dir
from rl_llm.urls import is_http_url

#: The longest query an env sends to a retriever; a longer one is an invalid action.
MAX_QUERY_CHARS = 1000


_INDEX_LOCK = threading.Lock()


def _shared_bm25(corpus_key: tuple[Any, ...], cache_dir: str) -> BM25Retriever:
    """One BM25 index per corpus and process, shared by every environment instance (built once even when
    many envs start at the same time in threads)."""
    with _INDEX_LOCK:
        return _load_bm25(corpus_key, cache_dir)


@functools.lru_cache(maxsize=16)
def _load_bm25(corpus_key: tuple[Any, ...], cache_dir: str) -> BM25Retriever:
    # Imported here: the bundled knowledge base is built from this package's corpus and BM25 modules.
    from rl_llm.envs.knowledge import bundled_kb

    passages = bundled_kb(corpus_key[1]).passages if corpus_key[0] == "bundled" else load_corpus(corpus_key[1])
    return BM25Retriever(passages, cache_dir=cache_dir)


def resolve_retriever(retriever: Retriever | str, corpus: str | os.PathLike[str] | None, kb_seed: int,
                      cache_dir: str | os.PathLike[str] | None) -> Retriever:  # fmt: skip
    """``"bm25"`` (shared in-process index over the corpus), an ``http://`` URL (a retriever server), or any
    object with ``search_batch``."""
    if isinstance(retriever, str) and is_http_url(retriever):
        return RetrieverClient(retriever)
    if retriever == "bm25":
        # A file corpus is keyed by path and modification time, so an edited file gets a fresh index.
        path = None if corpus is None else Path(corpus).resolve()
        key: tuple[Any, ...] = ("bundled", kb_seed) if path is None else ("file", str(path), path.stat().st_mtime_ns)
        return _shared_bm25(key, str(cache_dir or package_cache_dir() / "indexes"))
    if isinstance(retriever, str) or not callable(getattr(retriever, "search_batch", None)):
        raise ValueError(f"retriever must be 'bm25', an http:// URL or an object with search_batch, got {retriever!r}")
    return retriever


def made_from_url(retriever: Retriever, spec: Retriever | str) -> bool:
    """Whether ``resolve_retriever`` made ``retriever`` from ``spec`` as a client of a server URL: the env then
    owns its HTTP connections and closes them on ``close()`` (a retriever passed in stays its owner's)."""
    return isinstance(spec, str) and isinstance(retriever, RetrieverClient)


def retrieve_or_explain(retriever: Retriever, query: str, k: int) -> tuple[list[Any], str]:
    """Hits for one query, or no hits and the reason the search failed (shown to the agent)."""
    try:
        return retriever.search_batch([query], k)[0], ""
    except (RetrievalError, OSError, ValueError) as exc:
        return [], f"search failed: {exc}"
