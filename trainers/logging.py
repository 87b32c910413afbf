"""Training metrics: JSONL (one line per step, the source of truth), TensorBoard, PNG curves, live progress, and
the experiment trackers of ``log.report_to`` (``trackers.py``: W&B, trackio, MLflow).

Resume keeps the logs exact: on start the JSONL is cut back to the steps covered by the checkpoint being
resumed (steps logged after it are re-run, and a line half-written when the process was killed is dropped),
and TensorBoard's ``purge_step`` discards its events past that step in the same way.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from rl_llm.console import make_console
from rl_llm.trainers.checkpoint import write_text_atomic
from rl_llm.trainers.trackers import SUMMARY_SCALARS, Table, Trackers, episode_table, scalars

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"  # a few whole episodes per step, for `rl-llm view`
CURVE_KEYS = ("reward/mean", "episode/invalid_action_frac", "env/regret", "loss/entropy", "loss/kl_ref",
              "loss/value_loss", "eval/return", "time/step_s")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The complete records of a metrics JSONL file (a torn last line is skipped)."""
    records = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
    return records


def _wait_for_a_later_event_file_name(directory: Path) -> None:
    """TensorBoard reads a run's event files in name order, and a name starts with the creation second
    (then host and pid). A resumed run's file created in the same second as the killed run's could sort
    first; the killed run's ``purge_step`` marker would then wipe the resumed steps. Starting in a later
    second keeps the files in creation order (this waits at most a second, and only on a quick resume)."""
    stamps = [int(p.name.split(".")[3]) for p in directory.glob("events.out.tfevents.*") if p.name.split(".")[3].isdigit()]
    while stamps and int(time.time()) <= max(stamps):
        time.sleep(0.05)


class MetricsWriter:
    """Writes each step's record to every sink: metrics.jsonl, samples.jsonl, TensorBoard (scalars; the config,
    sampled episodes and summary in its text tab) and the ``trackers`` (docs/trackers.md#what-each-tracker-receives)."""

    def __init__(self, run_dir: str | Path, resume_step: int = 0, tensorboard: bool = True,
                 trackers: Trackers | None = None, config_text: str = "") -> None:  # fmt: skip
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        kept = [r for r in read_metrics(self.path) if r["step"] <= resume_step]
        write_text_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self.handle = self.path.open("a", encoding="utf-8")
        self.samples_path = self.run_dir / SAMPLES_FILE
        if self.samples_path.exists():  # cut back to the checkpoint like the metrics (those steps re-run)
            kept_samples = [line for line in self.samples_path.read_text(encoding="utf-8").splitlines()
                            if _sample_step(line) is not None and _sample_step(line) <= resume_step]  # fmt: skip
            write_text_atomic(self.samples_path, "".join(line + "\n" for line in kept_samples))
        self.tensorboard = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            directory = self.run_dir / "tensorboard"
            _wait_for_a_later_event_file_name(directory)
            self.tensorboard = SummaryWriter(str(directory), purge_step=resume_step + 1)
            if config_text and resume_step == 0:  # indented: shown verbatim by the text tab's Markdown
                self.tensorboard.add_text("config", "    " + config_text.replace("\n", "\n    "), 0)
        self.trackers = trackers

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **metrics}
        self.handle.write(json.dumps(record) + "\n")
        self.handle.flush()
        os.fsync(self.handle.fileno())
        if self.tensorboard is not None:
            for name, value in scalars(metrics).items():
                self.tensorboard.add_scalar(name, value, step)
            self.tensorboard.flush()
        if self.trackers:
            self.trackers.log_metrics(step, metrics)

    def log_samples(self, step: int, trajectories: Sequence[Any], count: int) -> None:
        """Append ``count`` of the step's episodes to samples.jsonl: the best and the worst return first, so
        `rl-llm view` shows what the policy is pushed towards and away from."""
        if count <= 0 or not trajectories:
            return
        ranked = sorted(trajectories, key=lambda t: t.total_reward)
        picked = list(dict.fromkeys([id(ranked[-1]), id(ranked[0]), *(id(t) for t in trajectories)]))[:count]
        by_id = {id(t): t for t in trajectories}
        with self.samples_path.open("a", encoding="utf-8") as handle:
            for key in picked:
                record = json.loads(by_id[key].to_json())
                handle.write(json.dumps({"step": step, **record}, ensure_ascii=False) + "\n")
        episodes = [by_id[key] for key in picked]
        if self.tensorboard is not None:
            table = episode_table(step, episodes)
            text = [row[table.columns.index("conversation")] for row in table.rows]
            conversations = "\n\n".join("    " + t.replace("\n", "\n    ") for t in text)  # verbatim blocks
            self.tensorboard.add_text("episodes", table.markdown(skip=("conversation",)) + "\n\n" + conversations,
                                      step)  # fmt: skip
            self.tensorboard.flush()
        if self.trackers:
            self.trackers.log_episodes(step, episodes)

    def log_summary(self, step: int, summary: dict[str, Any], table: Table) -> None:
        """The end of the run: summary.json's headline figures and the before/after/baselines table."""
        if self.tensorboard is not None:
            for name, value in scalars({k: summary.get(k) for k in SUMMARY_SCALARS}).items():
                self.tensorboard.add_scalar(f"summary/{name}", value, step)
            self.tensorboard.add_text("summary/comparison", table.markdown(), step)
            self.tensorboard.flush()
        if self.trackers:
            self.trackers.log_summary(step, summary, table)

    def close(self) -> None:
        self.handle.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.trackers is not None:
            self.trackers.close()


def plot_curves(records: Sequence[dict[str, Any]], path: str | Path, keys: Iterable[str] = CURVE_KEYS,
                title: str = "") -> Path | None:
    """One panel per metric present in ``records`` (x = step); None when there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [k for k in keys if any(isinstance(r.get(k), (int, float)) for r in records)]
    if not present:
        return None
    columns = min(3, len(present))
    rows = math.ceil(len(present) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.0 * rows), squeeze=False)
    for axis, key in zip(axes.flat, present, strict=False):
        points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
        axis.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 40 else None)
        axis.set_title(key)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    for axis in list(axes.flat)[len(present) :]:
        axis.set_visible(False)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def describe(metrics: dict[str, Any]) -> str:
    """The one-line summary shown in the progress display."""
    parts = [
        ("reward", metrics.get("reward/mean"), "{:.3f}"),
        ("kl", metrics.get("loss/kl_ref", metrics.get("loss/approx_kl_old")), "{:.4f}"),
        ("tok/s", metrics.get("throughput/policy_tokens_per_s"), "{:.0f}"),
        ("rollout", metrics.get("time/rollout_s"), "{:.2f}s"),
        ("update", metrics.get("time/update_s"), "{:.2f}s"),
    ]
    return "  ".join(f"{name} {fmt.format(value)}" for name, value, fmt in parts if isinstance(value, (int, float)))


def _sample_step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):  # a torn last line
        return None


class ProgressDisplay:
    """A rich progress bar with the latest step's figures; plain lines when stdout is not a terminal;
    nothing when disabled."""

    def __init__(self, total: int, start: int, enabled: bool = True, console: Console | None = None) -> None:
        self.console = console or make_console()
        self.enabled = enabled
        self.live = enabled and self.console.is_terminal and sys.stdout.isatty()
        self.total = total
        self.progress: Progress | None = None
        if self.live:
            self.progress = Progress(
                TextColumn("[bold]train"), BarColumn(bar_width=24), MofNCompleteColumn(), TimeElapsedColumn(),
                TimeRemainingColumn(), TextColumn("{task.description}"), console=self.console,
            )  # fmt: skip
            self.task = self.progress.add_task("", total=total, completed=start)

    def __enter__(self) -> ProgressDisplay:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        text = describe(metrics)
        if self.progress is not None:
            self.progress.update(self.task, completed=step, description=text)
        elif self.enabled:
            self.console.print(f"step {step}/{self.total}  {text}", markup=False, highlight=False)


def plot_comparison(rows: dict[str, Any], path: str | Path, title: str = "", metric: str = "return") -> Path:
    """Bars of mean ``metric`` with 95% intervals, one per agent (``rows``: name -> EvalResult)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    stats = [rows[name].ci95(metric) for name in names]
    figure, axis = plt.subplots(figsize=(1.6 * len(names) + 2.5, 3.6))
    errors = [0.0 if math.isnan(half) else half for _, half in stats]
    axis.bar(range(len(names)), [mean for mean, _ in stats], yerr=errors, capsize=4,
             color=["#999999", "#2a7ab9"] + ["#c9a227"] * (len(names) - 2))  # fmt: skip
    axis.set_xticks(range(len(names)), names, rotation=15, ha="right")
    axis.set_ylabel(f"mean {metric} (95% CI)")
    axis.set_title(title)
    axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
