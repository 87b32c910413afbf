"""HTTP client of a retriever server: ours (``rl_llm.envs.retrieval.server``) or Search-R1's, which speak the
same ``POST /retrieve {"queries", "topk", "return_scores"}`` protocol."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from rl_llm import checks
from rl_llm.envs.retrieval.base import Hit, RetrievalError, check_queries
from rl_llm.envs.retrieval.corpus import Passage, split_contents
from rl_llm.urls import check_server_url, shown_url


def passage_from_document(document: dict[str, Any]) -> Passage:
    """A Passage from a server document: ``id``/``title``/``text``, or Search-R1's ``contents``
    (``"title"\\ntext``)."""
    if "text" in document:
        return Passage(str(document.get("id", "")), str(document.get("title", "")), str(document["text"]))
    title, text = split_contents(str(document.get("contents", "")))
    return Passage(str(document.get("id", "")), title, text)


def utf8_safe(query: str) -> str:
    """``query`` as UTF-8 can carry it: a lone surrogate (an LLM's text may hold one; no UTF-8 encoder takes
    it, so the request was never sent and the search failed with a codec error) as U+FFFD, the rule the
    servers follow for what they write (docs/serving.md)."""
    try:
        query.encode()
    except UnicodeEncodeError:
        return query.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return query


class RetrieverClient:
    """``search_batch`` over HTTP. Thread-safe (one pooled ``httpx.Client``); large batches are split into
    requests of ``max_batch`` queries."""

    def __init__(self, url: str, *, timeout: float = 30.0, max_batch: int = 256) -> None:
        self.url = check_server_url("the retriever url", url).rstrip("/")
        self.max_batch = checks.integer("max_batch", max_batch, minimum=1)
        self._http = httpx.Client(timeout=checks.seconds("timeout", timeout))
        self._shown = shown_url(self.url)  # for messages: credentials in the URL stay out of logs

    def search(self, query: str, k: int = 3) -> list[Hit]:
        return self.search_batch([query], k)[0]

    def search_batch(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        queries = check_queries(queries, k)
        results: list[list[Hit]] = []
        for start in range(0, len(queries), self.max_batch):
            chunk = [utf8_safe(query) for query in queries[start : start + self.max_batch]]
            payload = self._post("/retrieve", {"queries": chunk, "topk": k, "return_scores": True})
            rows = payload.get("result") if isinstance(payload, dict) else None
            if not isinstance(rows, list) or len(rows) != len(chunk) or not all(isinstance(r, list) for r in rows):
                raise RetrievalError(f"retriever at {self._shown} sent a malformed response (no 'result' list per query)")
            results += [[self._hit(item) for item in row] for row in rows]
        return results

    def _hit(self, item: Any) -> Hit:
        if isinstance(item, dict) and isinstance(item.get("document"), dict):
            score = item.get("score", 0.0)
            # a null or text score was a TypeError or ValueError out of float(), not an answer the env reports
            if isinstance(score, bool) or not isinstance(score, (int, float)):
                raise RetrievalError(f"retriever at {self._shown} sent a malformed response (score {score!r} is not a "
                                     f"number)")  # fmt: skip
            return Hit(passage_from_document(item["document"]), float(score))
        if isinstance(item, dict):
            return Hit(passage_from_document(item), 0.0)
        raise RetrievalError(f"retriever returned a non-object document: {str(item)[:80]!r}")

    def health(self) -> dict[str, Any]:
        try:
            response = self._http.get(self.url + "/health")
            response.raise_for_status()
            return response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise RetrievalError(f"retriever at {self._shown} is not healthy: {exc}") from exc

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        try:
            response = self._http.post(self.url + path, json=body)
        except httpx.HTTPError as exc:
            raise RetrievalError(f"retriever at {self._shown} is unreachable: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise RetrievalError(f"retriever at {self._shown} answered HTTP {response.status_code}: {response.text[:200]}")
        try:
            return response.json()
        except ValueError as exc:
            raise RetrievalError(f"retriever at {self._shown} sent invalid JSON") from exc
        except RecursionError:  # nested past the parser's limit: it raised out of the env's step
            raise RetrievalError(f"retriever at {self._shown} sent invalid JSON (nested too deeply)") from None

    def close(self) -> None:
        """Close its pooled HTTP connections; an env that made this client from a URL closes it on ``close()``."""
        self._http.close()

    def __enter__(self) -> RetrieverClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
