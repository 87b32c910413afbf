"""``rl-llm export``: episodes of any trajectory file or run directory as a dataset for other tools.

Sources (docs/export.md#what-it-reads): a trajectories JSONL (``Trajectory.to_json`` lines: ``rl-llm eval``'s
``*.trajectories.jsonl``, a bench run's ``episodes.trajectories.jsonl``, a trainer's ``samples.jsonl``, whose
lines also carry ``step``), an episode log whose trajectories sit beside it (``rl-llm eval``'s ``X.jsonl``,
bench's ``episodes.jsonl``: their ``.trajectories.jsonl`` sibling is read), or a run directory (its
``samples.jsonl``, else its ``*.trajectories.jsonl``).

Every format holds one row per episode, in chat form: ``messages`` (standard ``{role, content}`` dicts;
each assistant message, a policy turn, also carries the turn's ``reward`` and ``train``: false for a turn
the env rejected as invalid), the episode's ``return`` and where it came from (``env_id``, ``task_id``,
``seed``, ``group_id``, ...). Formats: ``sft-jsonl`` (plain JSONL, what TRL's ``SFTTrainer`` and the
trainer's own warm start, ``sft.data``, read), ``parquet`` (pyarrow) and ``hf`` (a ``datasets`` dataset,
``save_to_disk``); pyarrow and datasets are the ``export`` extra and imported only when asked for.

Filters for rejection sampling: ``min_return`` keeps episodes whose return is at least that;
``best_per_group`` keeps the best episode of each GRPO group (``group_id``, per training step for samples).
Episodes that ended on an error are never exported.

This module sits in the core layer (it imports only ``rl_llm.types`` and ``rl_llm.paths``), so the trainer's
warm start reads the same files with ``read_sft_jsonl``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_llm.paths import atomic_dir, atomic_path, is_training_run

FORMATS = ("hf", "parquet", "sft-jsonl")
SAMPLES_FILE = "samples.jsonl"  # trainers/logging.py
TRAJECTORIES_SUFFIX = ".trajectories.jsonl"
INSTALL = "pip install 'rl-llm[export]'"
# The fields of a trajectory record copied into each row (besides messages and return).
EPISODE_FIELDS = ("env_id", "task_id", "seed", "group_id", "group_index", "end_reason", "policy_version")
# A UTF-16 surrogate: in text only from a lone "\ud800" escape in the JSON read, and no UTF-8 writer takes one.
SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass
class Export:
    """What ``export`` wrote: the rows kept, and what was read and left out."""

    out: Path
    rows: list[dict[str, Any]]
    sources: list[Path]
    read: int = 0
    skipped_lines: int = 0
    errored: int = 0
    filtered: int = 0
    notes: list[str] = field(default_factory=list)


# -- reading ----------------------------------------------------------------------------------------------
def trajectory_sources(path: str | Path) -> list[Path]:
    """The trajectory files behind ``path``: the file, or a run directory's samples or trajectories."""
    path = Path(path)
    if path.is_dir():
        if (path / SAMPLES_FILE).is_file():
            return [path / SAMPLES_FILE]
        found = sorted(path.glob("*" + TRAJECTORIES_SUFFIX))
        if not found:
            raise FileNotFoundError(f"{path} holds no {SAMPLES_FILE} or *{TRAJECTORIES_SUFFIX} to export")
        return found
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such trajectories file or run directory")
    return [path]


def _lines(path: Path) -> Iterable[str]:
    with path.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if line.strip():
                yield line


def _objects(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


def _is_trajectory(record: Any) -> bool:
    # Every message and turn an object too: a line that only looks like a record is skipped, not a crash.
    return isinstance(record, dict) and _objects(record.get("messages")) and _objects(record.get("turns"))


def read_records(path: str | Path) -> tuple[list[tuple[dict[str, Any], Path]], int, list[str]]:
    """((trajectory record, the file it came from), ..., lines that were not one, notes). A file of episode
    log lines (no turns) is read through its ``.trajectories.jsonl`` sibling. ValueError when no line of any
    source is a trajectory record."""
    sources, notes = trajectory_sources(path), list[str]()
    records: list[tuple[dict[str, Any], Path]] = []
    skipped, total = 0, 0
    for source in sources:
        for line in _lines(source):
            total += 1
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            if _is_trajectory(record):
                records.append((record, source))
            else:
                skipped += 1
    if not records and len(sources) == 1 and (sibling := _sibling(sources[0])) is not None:
        found, more, _ = read_records(sibling)
        return found, more, [f"{sources[0]} holds episode records, not trajectories: read {sibling}"]
    if not records:
        where = ", ".join(str(source) for source in sources)
        what = f"{total} non-empty line(s), none of them" if total else "no line, so no"
        raise ValueError(
            f"{where} holds {what} a trajectory record (Trajectory.to_json, with messages and turns)"
        )
    return records, skipped, notes


def _sibling(path: Path) -> Path | None:
    if path.name.endswith(TRAJECTORIES_SUFFIX) or path.name == SAMPLES_FILE:
        return None
    sibling = path.with_suffix(TRAJECTORIES_SUFFIX)
    return sibling if sibling.is_file() else None


def number(value: Any) -> float:
    """A record's reward or metric as a float: 0.0 for what is no number (null, text), and an integer past
    float's range (JSON allows any size) as an infinity of its sign instead of an OverflowError."""
    if not isinstance(value, (int, float)):
        return 0.0
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def episode_return(record: dict[str, Any]) -> float:
    total = record.get("total_reward")
    if isinstance(total, (int, float)):
        return number(total)
    return sum(number(turn.get("reward")) for turn in record.get("turns") or [])


def to_row(record: dict[str, Any], source: str = "") -> dict[str, Any]:
    """One episode as a chat-format row: ``messages`` with each assistant message's turn ``reward`` and
    ``train`` flag (false for an invalid action, or an answer the env never stepped), plus the episode's
    return and provenance."""
    turns = record.get("turns") or []
    messages: list[dict[str, Any]] = []
    assistant = 0
    for message in record.get("messages") or []:
        row: dict[str, Any] = {
            "role": str(message.get("role", "")),
            "content": str(message.get("content", "")),
        }
        if row["role"] == "assistant":
            turn = turns[assistant] if assistant < len(turns) else None
            row["reward"] = number(turn.get("reward")) if turn is not None else None
            row["train"] = turn is not None and not turn.get("invalid_action", False)
            assistant += 1
        messages.append(row)
    out: dict[str, Any] = {"messages": messages, "return": episode_return(record)}
    out.update({name: record.get(name) for name in EPISODE_FIELDS})
    out["step"] = record.get("step")
    out["turns"] = len(turns)
    metrics = record.get("metrics")
    out["metrics"] = {k: number(v) for k, v in (metrics if isinstance(metrics, dict) else {}).items()
                      if isinstance(v, (int, float))}  # fmt: skip
    out["source"] = source
    return out


def select(rows: list[dict[str, Any]], min_return: float | None = None,
           best_per_group: bool = False) -> list[dict[str, Any]]:  # fmt: skip
    """Rejection sampling: the best row of each group (ties: the first), then rows with return >= min_return.
    A group is ``group_id`` (with ``step`` for training samples; a row without one is its own group)."""
    if best_per_group:
        best: dict[Any, dict[str, Any]] = {}
        for index, row in enumerate(rows):
            # repr: a group_id or step read from JSON may be a list, which no dict key can be
            key = repr((row.get("source"), row.get("step"), row.get("group_id"))) if row.get("group_id") else index
            if key not in best or row["return"] > best[key]["return"]:
                best[key] = row
        chosen = {id(row) for row in best.values()}
        rows = [row for row in rows if id(row) in chosen]
    if min_return is not None:
        rows = [row for row in rows if row["return"] >= min_return]
    return rows


# -- writing ----------------------------------------------------------------------------------------------
def default_out(path: str | Path, fmt: str) -> Path:
    path = Path(path)
    suffix = {"hf": ".hf", "parquet": ".parquet", "sft-jsonl": ".sft.jsonl"}[fmt]
    if path.is_dir():
        return path / f"export{suffix}"
    return path.with_name(path.name.removesuffix(".jsonl") + suffix)


def _need(module: str, fmt: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as error:
        package = module.split(".")[0]
        raise ImportError(f"--format {fmt} needs the {package} package: {INSTALL} "
                          f"(or pip install {package})") from error  # fmt: skip


def write_sft_jsonl(rows: list[dict[str, Any]], out: Path) -> None:
    with atomic_path(out) as partial, partial.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")


def writable(value: Any) -> Any:
    """``value`` (JSON-like) with what a writer cannot take made plain: NaN and infinities as null (JSON has
    none; Arrow would keep them, but one rule for every format) and lone surrogates as U+FFFD (no UTF-8
    encoder takes them: the write would fail)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [writable(item) for item in value]
    if isinstance(value, dict):
        return {writable(key): writable(item) for key, item in value.items()}
    return value


def write_rows(rows: list[dict[str, Any]], fmt: str, out: Path) -> None:
    if fmt == "sft-jsonl":
        write_sft_jsonl(rows, out)
    elif fmt in ("parquet", "hf"):
        pa = _need("pyarrow", fmt)  # datasets builds on it too
        try:
            _write_arrow(rows, fmt, out)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as error:  # the last two: a traceback
            raise ValueError(f"--format {fmt} cannot store these episodes ({error}): a field holds values of "
                             "different types, or a number past 64 bits; --format sft-jsonl keeps the records "
                             "as they are") from None  # fmt: skip
    else:
        raise ValueError(f"unknown export format {fmt!r}; one of {', '.join(FORMATS)}")


def _write_arrow(rows: list[dict[str, Any]], fmt: str, out: Path) -> None:
    if fmt == "parquet":
        pa = _need("pyarrow", fmt)
        pq = _need("pyarrow.parquet", fmt)
        table = pa.Table.from_pylist(rows)
        with atomic_path(out) as partial:
            pq.write_table(table, partial)
        return
    datasets = _need("datasets", fmt)
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # a redrawn bar is noise in a pipe or a log
    try:
        # save_to_disk writes the shards, then state.json: one that fails midway (a full disk, a file size
        # limit) would leave a directory load_from_disk cannot read, or an earlier export half replaced
        with atomic_dir(out) as partial:
            datasets.Dataset.from_list(rows).save_to_disk(str(partial))
    finally:
        if bars:
            datasets.enable_progress_bars()


def is_saved_dataset(path: Path) -> bool:
    """``path`` holds what ``Dataset.save_to_disk`` writes (an earlier ``--format hf`` export)."""
    return (path / "state.json").is_file() and (path / "dataset_info.json").is_file()


def check_out(out: Path, reads: list[Path]) -> None:
    """Refuse an output that is one of the files (or the run directory) being read: writing it would
    replace the input with the output."""
    if any(out.resolve() == path.resolve() for path in reads):
        raise ValueError(f"{out} is what is being read; name another output with --out (writing it would "
                         "replace the input)")  # fmt: skip
    # In a training run's folders the trainer would take the export for its own: a step_* directory under
    # checkpoints/ for a checkpoint to resume from (then pruned), model/ is rewritten at the end of a run. Its
    # top level is where the default output goes (DIR/export.*): nothing there reads those names.
    resolved = out.resolve()
    for run in resolved.parents[1:]:
        if is_training_run(run):
            folder = resolved.relative_to(run).parts[0]
            raise ValueError(f"--out {out} is inside {folder}/ of the training run {run}, which the trainer manages; "
                             "write the export at the run directory's top level or outside it")


def export(path: str | Path, fmt: str, out: str | Path | None = None, *, min_return: float | None = None,
           best_per_group: bool = False) -> Export:  # fmt: skip
    """Read ``path``, filter, write ``fmt`` to ``out`` (default: next to ``path``); returns what was done."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; one of {', '.join(FORMATS)}")
    if fmt == "hf":  # fail before reading anything when the package is missing
        _need("datasets", fmt)
    elif fmt == "parquet":
        _need("pyarrow.parquet", fmt)
    records, skipped, notes = read_records(path)
    sources = list(dict.fromkeys(source for _, source in records))
    errored = sum(1 for record, _ in records if record.get("error"))
    rows = [to_row(record, str(source)) for record, source in records if not record.get("error")]
    kept = writable(select(rows, min_return, best_per_group))
    if not kept:
        best = max((row["return"] for row in rows), default=None)
        why = "every episode ended on an error" if not rows else \
            f"no episode passes the filters (best return {best:.4g})"  # fmt: skip
        raise ValueError(f"nothing to export from {path}: {why}")
    target = Path(out) if out else default_out(path, fmt)
    check_out(target, [Path(path), *sources])
    if fmt == "hf" and target.is_file():  # save_to_disk's own error says only "File exists"
        raise ValueError(f"--out {target} is a file; --format hf writes a directory (datasets' save_to_disk)")
    if fmt == "hf" and target.is_dir() and any(target.iterdir()) and not is_saved_dataset(target):
        # replaced whole, as other formats replace their file: only an earlier export may go
        raise ValueError(f"--out {target} is a directory that holds no saved dataset (state.json, dataset_info.json); "
                         "--format hf replaces only an earlier export: name a new directory")
    write_rows(kept, fmt, target)
    return Export(target, kept, sources, read=len(records), skipped_lines=skipped, errored=errored,
                  filtered=len(rows) - len(kept), notes=notes)  # fmt: skip


# -- the warm start's reader ------------------------------------------------------------------------------
def read_sft_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The episodes of an ``sft-jsonl`` file (``rl-llm export --format sft-jsonl``, or any JSONL of
    ``{"messages": [{role, content}, ...]}`` lines; an assistant message without ``train`` is trained on).
    FileNotFoundError / ValueError with the path and line when the file is missing or a line is not one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no such sft-jsonl file (write one with rl-llm export --format sft-jsonl)"
        )
    rows = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:  # named no file
        raise ValueError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start}); an sft-jsonl file is "
                         "JSON lines") from None  # fmt: skip
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error.msg})") from None
        except ValueError as error:  # an int past 4,300 digits
            raise ValueError(f"{path}:{number}: not JSON ({error})") from None
        except RecursionError:
            raise ValueError(f"{path}:{number}: not JSON (nested too deeply)") from None
        messages = row.get("messages") if isinstance(row, dict) else None
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        ):
            raise ValueError(
                f'{path}:{number}: expected {{"messages": [{{"role": ..., "content": ...}}, ...]}}'
            )
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no episode")
    return rows
