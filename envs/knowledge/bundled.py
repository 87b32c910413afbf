"""The bundled offline data set: a knowledge base drawn from a seed at first use and cached as JSONL.

``bundled_kb()`` returns the passages, the 1-3 hop search questions and the tool tasks. The files are
written once under ``<cache>/kb-v{KB_FORMAT}-seed{seed}/`` (inspectable, and usable with any other tool such
as the retriever server) and read back in later processes; within a process the result is memoised.
"""

from __future__ import annotations

import functools
import json
import threading
from dataclasses import dataclass
from pathlib import Path

from rl_llm.envs.knowledge.generator import generate_kb
from rl_llm.envs.knowledge.questions import ToolTask, search_questions, tool_tasks
from rl_llm.envs.retrieval.bm25 import BM25Retriever
from rl_llm.envs.retrieval.corpus import (
    Passage,
    QAExample,
    load_corpus,
    load_qa,
    write_jsonl,
)
from rl_llm.paths import cache_dir as package_cache_dir

KB_FORMAT = 3  # bump whenever generation changes, so that stale cached files are not read back
SEARCH_QUESTIONS_PER_HOPS = {1: 150, 2: 150, 3: 150}
TOOL_TASKS_PER_KIND = 30
CORPUS_FILE, SEARCH_QA_FILE, TOOL_TASKS_FILE = "corpus.jsonl", "search_qa.jsonl", "tool_tasks.jsonl"


@dataclass(frozen=True)
class Bundle:
    directory: Path
    passages: list[Passage]
    search_questions: list[QAExample]
    tool_tasks: list[ToolTask]

    @property
    def corpus_path(self) -> Path:
        return self.directory / CORPUS_FILE


def write_bundle(directory: Path, seed: int) -> None:
    kb = generate_kb(seed)
    passages = kb.passages()
    write_jsonl(({"id": p.id, "title": p.title, "text": p.text} for p in passages), directory / CORPUS_FILE)
    # Multi-hop questions whose verbatim search shows a later hop's passage are redrawn ("k hops, k searches").
    retriever = BM25Retriever(passages)
    questions = search_questions(kb, SEARCH_QUESTIONS_PER_HOPS, seed=seed, retriever=retriever)
    write_jsonl((q.to_json() for q in questions), directory / SEARCH_QA_FILE)
    write_jsonl((t.to_json() for t in tool_tasks(kb, TOOL_TASKS_PER_KIND, seed=seed)), directory / TOOL_TASKS_FILE)
    (directory / "COMPLETE").write_text(f"seed={seed} format={KB_FORMAT}\n")


_BUILD_LOCK = threading.Lock()


def bundled_kb(seed: int = 0, cache_dir: str | None = None) -> Bundle:
    """The bundled set for ``seed`` (generated and cached on first use; envs starting together in threads
    wait for one build instead of racing)."""
    with _BUILD_LOCK:
        return _bundled_kb(seed, cache_dir)


@functools.lru_cache(maxsize=8)
def _bundled_kb(seed: int, cache_dir: str | None) -> Bundle:
    directory = Path(cache_dir or package_cache_dir()) / f"kb-v{KB_FORMAT}-seed{seed}"
    if not (directory / "COMPLETE").exists():
        write_bundle(directory, seed)
    with (directory / TOOL_TASKS_FILE).open(encoding="utf-8") as handle:
        tasks = [ToolTask.from_json(json.loads(line)) for line in handle if line.strip()]
    return Bundle(directory, load_corpus(directory / CORPUS_FILE), load_qa(directory / SEARCH_QA_FILE), tasks)
