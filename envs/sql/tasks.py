"""Text2SQL task records and their sources: the bundled Chinook set and Spider/BIRD-format directories.

A Spider-format directory (Spider 1.0, Spider-DK/Syn/Realistic, BIRD) holds the question files and one SQLite
file per database::

    PATH/dev.json, PATH/train_spider.json, ...      [{"db_id", "question", "query" | "SQL", "evidence"?}, ...]
    PATH/database/<db_id>/<db_id>.sqlite            (BIRD: PATH/dev_databases/<db_id>/<db_id>.sqlite)

``tables.json`` is not needed: the schema shown to the agent is read from each SQLite file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
CHINOOK_DB = DATA_DIR / "chinook.sqlite"
CHINOOK_QUESTIONS = DATA_DIR / "chinook_questions.json"

# split -> question files tried in order (the first that exists is used; "train" merges Spider's two).
SPLIT_FILES: dict[str, tuple[tuple[str, ...], ...]] = {
    "dev": (("dev.json",),),
    "train": (("train_spider.json", "train_others.json"), ("train.json",)),
    "test": (("test.json",),),
}
DATABASE_DIRS = ("database", "{split}_databases", "databases", "test_database")


@dataclass(frozen=True)
class SqlTask:
    """One question with its gold SQL on one SQLite database."""

    task_id: str
    db_id: str
    db_path: Path
    question: str
    gold_sql: str
    evidence: str = ""
    difficulty: str = ""


def load_chinook_tasks(
    questions_path: Path = CHINOOK_QUESTIONS, db_path: Path = CHINOOK_DB
) -> list[SqlTask]:
    """The bundled hand-written questions on the Chinook music-store database."""
    records = json.loads(questions_path.read_text(encoding="utf-8"))
    return [
        SqlTask(
            task_id=f"chinook-{record['id']}",
            db_id="chinook",
            db_path=db_path,
            question=record["question"],
            gold_sql=record["sql"],
            difficulty=record["difficulty"],
        )
        for record in records
    ]


def _question_files(root: Path, split: str) -> list[Path]:
    as_file = root / split
    if as_file.suffix == ".json" and as_file.is_file():
        return [as_file]
    if split not in SPLIT_FILES:
        choices = sorted(SPLIT_FILES)
        raise ValueError(f"unknown split {split!r}: use one of {choices} or a .json file name in {root}")
    for names in SPLIT_FILES[split]:
        files = [root / name for name in names if (root / name).is_file()]
        if files:
            return files
    wanted = " or ".join("+".join(names) for names in SPLIT_FILES[split])
    raise FileNotFoundError(f"no question file for split {split!r} in {root} (looked for {wanted})")


def _database_path(root: Path, split: str, db_id: str) -> Path | None:
    for pattern in DATABASE_DIRS:
        for name in (f"{db_id}.sqlite", f"{db_id}.db"):
            path = root / pattern.format(split=Path(split).stem) / db_id / name
            if path.is_file():
                return path
    return None


def _gold_sql(record: dict[str, Any]) -> str:
    for key in ("query", "SQL", "sql"):
        if isinstance(record.get(key), str):
            return record[key]
    raise ValueError(f"question record has no gold SQL ('query' or 'SQL'): keys {sorted(record)}")


def load_spider_tasks(data_dir: str | Path, split: str = "dev") -> list[SqlTask]:
    """Tasks of a Spider/BIRD-format directory. Questions whose database file is missing are an error."""
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"data_dir {root} is not a directory")
    tasks: list[SqlTask] = []
    db_paths: dict[str, Path | None] = {}  # db_id -> its file: looked up once, not once per question
    missing: set[str] = set()
    for path in _question_files(root, split):
        records = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(records, list):
            raise ValueError(f"{path} must hold a JSON list of question records")
        for number, record in enumerate(records):
            db_id = record["db_id"]
            if db_id not in db_paths:
                db_paths[db_id] = _database_path(root, split, db_id)
            db_path = db_paths[db_id]
            if db_path is None:
                missing.add(db_id)
                continue
            tasks.append(
                SqlTask(
                    task_id=f"{path.stem}-{number}",
                    db_id=db_id,
                    db_path=db_path,
                    question=record["question"],
                    gold_sql=_gold_sql(record),
                    evidence=record.get("evidence") or "",
                    difficulty=record.get("difficulty") or record.get("hardness") or "",
                )
            )
    if missing:
        shown = ", ".join(sorted(missing)[:5])
        raise FileNotFoundError(
            f"{len(missing)} databases of split {split!r} are missing under {root} (e.g. {shown}); "
            f"expected {root}/database/<db_id>/<db_id>.sqlite"
        )
    if not tasks:
        raise ValueError(f"split {split!r} in {root} has no questions")
    return tasks
