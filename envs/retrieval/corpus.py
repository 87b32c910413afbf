"""Corpora and QA sets as JSONL: ``{"id","title","text"}`` passages and ``{"question","answers"}`` questions.

These are the formats of the Search-R1 / FlashRAG style data a user already has (Wikipedia dumps with NQ,
HotpotQA, ...). Loading validates every line and names the file and line of the first bad one.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rl_llm.errors import RLLMError
from rl_llm.paths import atomic_path


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """Title and text on separate lines (``title\\ntext``, the title unquoted); what BM25 indexes."""
        return f"{self.title}\n{self.text}"


def split_contents(contents: str) -> tuple[str, str]:
    """``(title, text)`` of a Search-R1/FlashRAG ``contents`` field: the title on the first line (its
    surrounding spaces and double quotes dropped, as in ``"title"\\ntext``), the text after it."""
    title, _, text = contents.partition("\n")
    return title.strip().strip('"'), text


@dataclass(frozen=True)
class QAExample:
    """A question with its gold answers. ``optimal_tool_calls`` is set when the minimal number of searches
    is known (the bundled knowledge base); ``oracle_queries`` are the searches that suffice."""

    id: str
    question: str
    answers: tuple[str, ...]
    optimal_tool_calls: int | None = None
    oracle_queries: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        record["answers"], record["oracle_queries"] = list(self.answers), list(self.oracle_queries)
        return record


class DataFormatError(RLLMError, ValueError):
    """A corpus or QA file line that does not have the documented shape."""


def _json_lines(path: Path) -> Iterable[tuple[int, dict[str, Any]]]:
    """Each line's JSON object with its line number; any line that is not one is a ``DataFormatError`` naming
    the file and line (bytes that are not UTF-8, an integer past Python's 4,300 digits, nesting past the
    parser's recursion limit were each a bare error naming neither)."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataFormatError(f"{path}:{number}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFormatError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            except RecursionError:
                raise DataFormatError(f"{path}:{number}: not valid JSON (nested too deeply)") from None
            except ValueError as exc:  # int() past sys.get_int_max_str_digits
                raise DataFormatError(f"{path}:{number}: not valid JSON ({exc})") from None
            if not isinstance(record, dict):
                raise DataFormatError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
            yield number, record


def load_corpus(path: str | os.PathLike[str]) -> list[Passage]:
    """Passages from a JSONL file. ``title`` may be missing; a ``contents`` field (``"title"\\ntext``, the
    FlashRAG/Search-R1 layout) is accepted in place of ``title``/``text``."""
    path = Path(path)
    passages: list[Passage] = []
    seen: set[str] = set()
    for number, record in _json_lines(path):
        text, title = record.get("text"), record.get("title", "")
        if text is None and isinstance(record.get("contents"), str):
            title, text = split_contents(record["contents"])
        if not isinstance(text, str) or not isinstance(title, str):
            raise DataFormatError(f"{path}:{number}: a passage needs string 'text' (and optional 'title')")
        passage_id = str(record.get("id", len(passages)))
        if passage_id in seen:
            raise DataFormatError(f"{path}:{number}: duplicate passage id {passage_id!r}")
        seen.add(passage_id)
        passages.append(Passage(passage_id, title, text))
    if not passages:
        raise DataFormatError(f"{path}: the corpus is empty")
    return passages


def load_qa(path: str | os.PathLike[str]) -> list[QAExample]:
    """Questions from a JSONL file: ``question`` and ``answers`` (a list, or a single string; ``answer``,
    ``golden_answers`` and ``target`` are accepted as other names), optional ``id``, ``optimal_tool_calls``
    and ``oracle_queries``."""
    path = Path(path)
    examples: list[QAExample] = []
    for number, record in _json_lines(path):
        question = record.get("question")
        answers = next((record[key] for key in ("answers", "answer", "golden_answers", "target") if key in record), None)
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(question, str) or not question.strip():
            raise DataFormatError(f"{path}:{number}: 'question' must be a non-empty string")
        if not isinstance(answers, list) or not answers or not all(isinstance(a, (str, int, float)) for a in answers):
            raise DataFormatError(f"{path}:{number}: 'answers' must be a non-empty list of strings")
        optimal = record.get("optimal_tool_calls")
        if optimal is not None and (isinstance(optimal, bool) or not isinstance(optimal, int) or optimal < 0):
            raise DataFormatError(f"{path}:{number}: 'optimal_tool_calls' must be a non-negative integer")
        oracle = record.get("oracle_queries", [])
        if isinstance(oracle, str) or not isinstance(oracle, list):
            oracle = [oracle] if isinstance(oracle, str) else None
        if oracle is None or not all(isinstance(query, str) for query in oracle):
            raise DataFormatError(f"{path}:{number}: 'oracle_queries' must be a list of strings")
        examples.append(
            QAExample(
                id=str(record.get("id", f"{path.stem}-{len(examples)}")),
                question=question.strip(),
                answers=tuple(str(answer) for answer in answers),
                optimal_tool_calls=optimal,
                oracle_queries=tuple(oracle),
                meta=record.get("meta", {}) if isinstance(record.get("meta"), dict) else {},
            )
        )
    if not examples:
        raise DataFormatError(f"{path}: the QA file is empty")
    return examples


def write_jsonl(records: Iterable[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Write records atomically (a temporary file renamed into place), so readers never see half a file."""
    path = Path(path)
    # The temporary name is unique per writer: threads of one process (several envs starting at once) write too.
    with atomic_path(path) as partial, partial.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def corpus_fingerprint(passages: Sequence[Passage], *extra: object) -> str:
    """A short hash of the passages (and of any index parameters), naming cached indexes."""
    digest = hashlib.blake2b(digest_size=12)
    for passage in passages:
        for part in (passage.id, passage.title, passage.text):
            digest.update(part.encode("utf-8", "surrogatepass"))
            digest.update(b"\x00")
    digest.update(repr(extra).encode())
    return digest.hexdigest()
