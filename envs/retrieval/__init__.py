"""rl_llm.envs.retrieval: corpora, BM25 and dense retrievers, and a shared retriever server."""

from rl_llm.envs.retrieval.base import Hit, RetrievalError, Retriever, format_passages
from rl_llm.envs.retrieval.bm25 import BM25Retriever
from rl_llm.envs.retrieval.client import RetrieverClient
from rl_llm.envs.retrieval.corpus import Passage, QAExample, load_corpus, load_qa
from rl_llm.envs.retrieval.dense import DenseRetriever, HashingEmbedder, TransformersEmbedder


def __getattr__(name: str) -> object:
    # RetrieverServer on first use: the package is imported by every env that searches, and with the server
    # module already loaded, `python -m rl_llm.envs.retrieval.server` (the documented start) warned that runpy
    # found it in sys.modules before running it.
    if name == "RetrieverServer":
        from rl_llm.envs.retrieval.server import RetrieverServer

        return RetrieverServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BM25Retriever",
    "DenseRetriever",
    "HashingEmbedder",
    "Hit",
    "Passage",
    "QAExample",
    "RetrievalError",
    "Retriever",
    "RetrieverClient",
    "RetrieverServer",
    "TransformersEmbedder",
    "format_passages",
    "load_corpus",
    "load_qa",
]
