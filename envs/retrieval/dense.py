"""Dense retrieval with an embedding model the user supplies (no model is ever downloaded here).

``DenseRetriever`` takes any ``embed(texts) -> array[n, d]`` callable. Two are provided:
``TransformersEmbedder`` wraps a transformers encoder (a local path or a model object, mean or CLS pooling,
optional E5-style prefixes), and ``HashingEmbedder`` is a deterministic bag-of-words feature-hashing
embedder that needs no model at all (tests, offline smoke runs). Passage embeddings can be cached on disk
as ``.npy`` and are then loaded memory-mapped.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rl_llm.envs.retrieval.base import Hit, check_queries, top_k_indices
from rl_llm.envs.retrieval.corpus import Passage, corpus_fingerprint
from rl_llm.paths import atomic_path

Embedder = Callable[[Sequence[str]], np.ndarray]
_WORD = re.compile(r"\w\w+")


def _normalize_rows(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.maximum(norms, 1e-12)


class HashingEmbedder:
    """Words hashed (blake2b) into ``dim`` signed buckets, L2-normalised: deterministic across processes."""

    def __init__(self, dim: int = 512) -> None:
        self.dim = dim
        self.name = f"hashing-{dim}"

    def _bucket(self, word: str) -> tuple[int, float]:
        digest = int.from_bytes(hashlib.blake2b(word.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")
        return digest % self.dim, 1.0 if (digest >> 63) & 1 else -1.0

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in _WORD.findall(text.lower()):
                index, sign = self._bucket(word)
                out[row, index] += sign
        return _normalize_rows(out)


class TransformersEmbedder:
    """Embeddings from a transformers encoder: ``model`` is a loaded model or a *local* directory
    (``local_files_only``: nothing is fetched from a hub). ``pooling`` is "mean" or "cls"; E5-style models
    want ``query_prefix="query: "`` and ``passage_prefix="passage: "``."""

    def __init__(self, model: Any, tokenizer: Any = None, *, pooling: str = "mean", max_length: int = 256,
                 batch_size: int = 32, device: str = "cpu") -> None:  # fmt: skip
        import torch
        from transformers import AutoModel, AutoTokenizer

        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        if isinstance(model, (str, os.PathLike)):
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(model, local_files_only=True)
            model = AutoModel.from_pretrained(model, local_files_only=True)
        if tokenizer is None:
            raise ValueError("pass the tokenizer together with a model object")
        self.torch, self.model, self.tokenizer = torch, model.to(device).eval(), tokenizer
        self.pooling, self.max_length, self.batch_size, self.device = pooling, max_length, batch_size, device
        self.name = f"transformers-{getattr(model.config, '_name_or_path', '') or type(model).__name__}-{pooling}"

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        chunks = []
        with self.torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(list(texts[start : start + self.batch_size]), padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors="pt").to(self.device)  # fmt: skip
                hidden = self.model(**batch).last_hidden_state
                if self.pooling == "cls":
                    pooled = hidden[:, 0]
                else:
                    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
                chunks.append(pooled.float().cpu().numpy())
        return _normalize_rows(np.concatenate(chunks)) if chunks else np.zeros((0, 0), dtype=np.float32)


class DenseRetriever:
    """Inner-product search over normalised passage embeddings (cosine similarity).

    ``cache_dir`` keeps the passage matrix as ``.npy`` named by the corpus hash and ``embedder_name`` (or
    ``embed.name``), and loads it memory-mapped. ``query_prefix``/``passage_prefix`` are prepended before
    embedding (E5: "query: ", "passage: ").
    """

    def __init__(self, passages: Sequence[Passage], embed: Embedder, *, cache_dir: str | os.PathLike[str] | None = None,
                 embedder_name: str | None = None, query_prefix: str = "", passage_prefix: str = "",
                 batch_size: int = 256) -> None:  # fmt: skip
        if not passages:
            raise ValueError("DenseRetriever needs at least one passage")
        self.passages, self.embed, self.query_prefix = list(passages), embed, query_prefix
        self._lock = threading.Lock()
        name = embedder_name or getattr(embed, "name", None)
        if cache_dir is not None and name is None:
            raise ValueError("caching embeddings needs embedder_name= (or an embed callable with a .name)")
        path = None if cache_dir is None else Path(cache_dir) / f"dense-{corpus_fingerprint(passages, name, passage_prefix)}.npy"
        if path is not None and path.exists():
            self.matrix = np.load(path, mmap_mode="r")
            return
        texts = [passage_prefix + p.contents for p in self.passages]
        parts = [np.asarray(embed(texts[i : i + batch_size]), dtype=np.float32) for i in range(0, len(texts), batch_size)]
        self.matrix = _normalize_rows(np.concatenate(parts))
        if self.matrix.shape[0] != len(self.passages):
            raise ValueError(f"embed returned {self.matrix.shape[0]} rows for {len(self.passages)} passages")
        if path is not None:
            # np.save is given the open file: given a name, it would append ".npy" to the temporary one.
            with atomic_path(path) as partial, partial.open("wb") as handle:
                np.save(handle, self.matrix)
            self.matrix = np.load(path, mmap_mode="r")

    def __len__(self) -> int:
        return len(self.passages)

    def search(self, query: str, k: int = 3) -> list[Hit]:
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        queries = check_queries(queries, k)
        if not queries:
            return []
        with self._lock:  # user embedders (torch models) need not be thread-safe
            vectors = _normalize_rows(np.asarray(self.embed([self.query_prefix + q for q in queries]), dtype=np.float32))
        if vectors.shape[1] != self.matrix.shape[1]:
            raise ValueError(f"query embeddings have dimension {vectors.shape[1]}, passages {self.matrix.shape[1]}")
        scores = vectors @ np.asarray(self.matrix).T
        return [[Hit(self.passages[int(i)], float(row[i])) for i in top_k_indices(row, k)] for row in scores]
