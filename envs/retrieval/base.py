"""What every retriever returns and the one method the environments call."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from rl_llm.envs.retrieval.corpus import Passage
from rl_llm.errors import RLLMError


@dataclass(frozen=True)
class Hit:
    passage: Passage
    score: float


class RetrievalError(RLLMError, RuntimeError):
    """The retriever could not answer (server down, bad response); environments report it as text."""


@runtime_checkable
class Retriever(Protocol):
    """Anything with batched search: the in-process BM25 and dense indexes and the HTTP client."""

    def search_batch(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """The best ``k`` hits (or fewer) per query, best first."""
        ...


def check_queries(queries: Sequence[str], k: int) -> list[str]:
    """Validate a batch: a list of strings and a positive ``k``."""
    if isinstance(queries, str):
        raise TypeError("queries must be a sequence of strings, not one string (wrap it in a list)")
    queries = list(queries)
    if not all(isinstance(query, str) for query in queries):
        raise TypeError("every query must be a string")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    return queries


def top_k_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest scores, best first (ties by lower index), in O(n + k log k)."""
    k = min(k, scores.shape[-1])
    candidates = np.arange(k) if k == scores.shape[-1] else np.argpartition(-scores, k - 1)[:k]
    return candidates[np.lexsort((candidates, -scores[candidates]))]


def format_passages(hits: Sequence[Hit]) -> str:
    """Search-R1's layout: ``Doc {i}(Title: {title}) {text}`` per line, numbered from 1."""
    return "".join(f"Doc {i}(Title: {hit.passage.title}) {hit.passage.text}\n" for i, hit in enumerate(hits, start=1))
