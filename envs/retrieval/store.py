"""Passages on disk, read by memory map: a JSONL file plus an array of line offsets.

Reading slices of a shared ``mmap`` (no ``seek``) is safe from many threads, and a process that loads a
100k-passage store pays for the pages it touches, not for the whole corpus.
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rl_llm.envs.retrieval.corpus import Passage

PASSAGES_FILE = "passages.jsonl"
OFFSETS_FILE = "passage_offsets.npy"


def save_passages(passages: Sequence[Passage], directory: Path) -> None:
    offsets = np.empty(len(passages) + 1, dtype=np.int64)
    position = 0
    with (directory / PASSAGES_FILE).open("wb") as handle:
        for index, passage in enumerate(passages):
            offsets[index] = position
            line = json.dumps({"id": passage.id, "title": passage.title, "text": passage.text}, ensure_ascii=False)
            data = line.encode("utf-8", "surrogatepass") + b"\n"
            handle.write(data)
            position += len(data)
    offsets[-1] = position
    np.save(directory / OFFSETS_FILE, offsets)


class PassageStore:
    """Random access to the passages saved by ``save_passages``."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        directory = Path(directory)
        self._offsets = np.load(directory / OFFSETS_FILE, mmap_mode="r")
        # The map keeps its own descriptor, so the file is closed at once: a store nobody closes leaks nothing
        # (an open handle here was a ResourceWarning at every interpreter exit).
        with (directory / PASSAGES_FILE).open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, index: int) -> Passage:
        start, end = int(self._offsets[index]), int(self._offsets[index + 1])
        record = json.loads(self._map[start:end].decode("utf-8", "surrogatepass"))
        return Passage(record["id"], record["title"], record["text"])

    def close(self) -> None:
        if isinstance(self._map, mmap.mmap):
            self._map.close()
