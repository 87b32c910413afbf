"""BM25 throughput: rl-llm's bm25s retriever against rank_bm25, over a 100k-passage generated corpus.

Measured in one run on the same corpus, the same tokens and the same queries (entity names from the
knowledge base, as an agent would search them):
- index build time, tokenising included (rank_bm25; bm25s in memory; bm25s build + save to the on-disk cache;
  loading that cache memory-mapped),
- queries per second, one query per call and the whole batch in one call; rank_bm25 has no batch mode, so
  its "batched" figure is its per-query loop. rank_bm25 is timed on a subset of the queries (it scores every
  document in Python for each query term) and its rate is reported per query, which is what scales.
- the same queries through the HTTP retriever server from 8 concurrent clients.

Run: ``python benchmarks/search.py [--passages 100000] [--queries 2000] [--rank-bm25-queries 50]``.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Callable

import bm25s
import numpy as np

from rl_llm.envs.knowledge import generate_kb
from rl_llm.envs.retrieval import BM25Retriever, RetrieverClient, RetrieverServer
from rl_llm.envs.retrieval.bm25 import query_tokens


def timed(function: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def corpus_of(size: int):
    people = int(size * 0.595)
    companies = cities = int(size * 0.2)
    countries = size - people - companies - cities
    return generate_kb(0, countries=countries, cities=cities, companies=companies, people=people).passages()


def http_qps(retriever: BM25Retriever, queries: list[str], clients: int = 8) -> float:
    with RetrieverServer(retriever) as server:
        def work(part: list[str]) -> None:
            client = RetrieverClient(server.url)
            for query in part:
                client.search(query, 3)
            client.close()

        threads = [threading.Thread(target=work, args=(queries[i::clients],)) for i in range(clients)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return len(queries) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--rank-bm25-queries", type=int, default=50)
    args = parser.parse_args()

    from rank_bm25 import BM25Okapi

    generation_s, passages = timed(lambda: corpus_of(args.passages))
    rng = np.random.default_rng(0)
    queries = [passages[int(i)].title for i in rng.choice(len(passages), size=args.queries, replace=False)]
    print(f"corpus: {len(passages)} generated passages in {generation_s:.1f} s; {len(queries)} entity-name queries")
    print(f"bm25s {bm25s.__version__} index, scored by scipy sparse products; rank_bm25 BM25Okapi")

    with tempfile.TemporaryDirectory() as cache:
        BM25Retriever(passages[:1000]), BM25Okapi([["warm", "up"]])  # first-use costs out of the timings
        memory_s, _ = timed(lambda: BM25Retriever(passages))
        build_s, _ = timed(lambda: BM25Retriever(passages, cache_dir=cache))
        load_s, retriever = timed(lambda: BM25Retriever(passages, cache_dir=cache))
        tokenize_s, tokens = timed(lambda: [query_tokens(p.contents, "en") for p in passages])
        rank_index_s, rank = timed(lambda: BM25Okapi(tokens))
        rank_build_s = tokenize_s + rank_index_s  # the same tokenizer, so both builds include tokenising

        retriever.search_batch(queries[:10], 3)  # warm-up
        single_s, _ = timed(lambda: [retriever.search(q, 3) for q in queries])
        batch_s, batched = timed(lambda: retriever.search_batch(queries, 3))
        subset = queries[: args.rank_bm25_queries]
        subset_tokens = [query_tokens(query, "en") for query in subset]
        rank_s, rank_top = timed(lambda: [np.argsort(-rank.get_scores(t), kind="stable")[:3] for t in subset_tokens])
        server_qps = http_qps(retriever, queries[:500])

    agree = np.mean([passages[int(top[0])].id == hits[0].passage.id for top, hits in zip(rank_top, batched)])
    rank_qps = len(subset) / rank_s
    single_qps, batch_qps = len(queries) / single_s, len(queries) / batch_s
    print(f"\nindex build (tokenising included): rank_bm25 {rank_build_s:.2f} s | bm25s in memory {memory_s:.2f} s "
          f"({rank_build_s / memory_s:.1f}x) | bm25s build + save to cache {build_s:.2f} s | "
          f"memory-mapped load of the cache {load_s:.3f} s")  # fmt: skip
    print(f"{'mode':34s} {'queries/s':>10s} {'vs rank_bm25':>13s}")
    print(f"{'rank_bm25 (per query, ' + str(len(subset)) + ' queries)':34s} {rank_qps:10.1f} {1.0:12.1f}x")
    print(f"{'bm25s single query per call':34s} {single_qps:10.1f} {single_qps / rank_qps:12.1f}x")
    print(f"{'bm25s batch of ' + str(len(queries)):34s} {batch_qps:10.1f} {batch_qps / rank_qps:12.1f}x")
    print(f"{'HTTP server, 8 concurrent clients':34s} {server_qps:10.1f} {server_qps / rank_qps:12.1f}x")
    print(f"top-1 agreement with rank_bm25 on the subset: {agree:.0%} (lucene vs Okapi idf)")


if __name__ == "__main__":
    main()
