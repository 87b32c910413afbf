"""Experiment trackers named in ``log.report_to``: Weights & Biases, trackio and MLflow (TensorBoard is written
by ``logging.MetricsWriter`` itself).

Each tracker receives what the run's own files hold: the step's scalars (``metrics.jsonl``), the config
(``config.yaml``), the sampled episodes of each step (``samples.jsonl``) as a table with per-turn rewards, and at
the end the summary (``summary.json``) with the before/after/baselines comparison table. Each is an optional
extra, imported only when named; the names, env variables and defaults follow each tool's own conventions
(docs/trackers.md#what-each-tracker-receives). The run directory's ``trackers.json`` keeps each tracker's run id,
so a resumed run logs into the same tracker run (docs/trackers.md#resuming).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_llm.errors import RLLMError

# name -> (the module it imports, the extra that installs it)
TRACKERS = {"tensorboard": ("tensorboard", "llm"), "wandb": ("wandb", "wandb"), "trackio": ("trackio", "trackio"),
            "mlflow": ("mlflow", "mlflow")}  # fmt: skip
DEFAULT_PROJECT = "rl-llm"
STATE_FILE = "trackers.json"
# Added to a failed start's message: the way to log without an account or server.
START_HINTS = {"wandb": " (WANDB_MODE=offline logs without an account)",
               "mlflow": " (unset MLFLOW_TRACKING_URI for MLflow's local sqlite store)"}  # fmt: skip
EPISODE_COLUMNS = ("step", "task_id", "group_index", "seed", "return", "turns", "turn_rewards", "invalid_turns",
                   "end_reason", "policy_version", "conversation")  # fmt: skip
# The summary.json figures each tracker also gets as scalars (the run's headline numbers).
SUMMARY_SCALARS = ("return_before", "return_after", "baseline_random", "regret_before", "regret_after", "steps",
                   "resumed_from_step", "wall_time_s")  # fmt: skip


class TrackerError(RLLMError, RuntimeError):
    """A tracker named in ``log.report_to`` that cannot start (not installed, not logged in, unreachable)."""


def install_hint(name: str) -> str:
    return f"pip install 'rl-llm[{TRACKERS[name][1]}]'"


def report_to_problem(names: Sequence[str]) -> str | None:
    """Why ``log.report_to`` cannot be used here (an unknown or uninstalled tracker), or None. Checked when the
    config is loaded, without importing anything (a tracker's import takes seconds)."""
    for name in names:
        if name not in TRACKERS:
            return f"log.report_to: {name!r} is not one of {list(TRACKERS)}"
        if list(names).count(name) > 1:
            return f"log.report_to: {name!r} is named twice"
        if importlib.util.find_spec(TRACKERS[name][0]) is None:
            return f"log.report_to: {name} is not installed; {install_hint(name)}"
    return None


@dataclass
class Table:
    """Rows of values under named columns: what every tracker's table type is built from."""

    columns: list[str]
    rows: list[list[Any]]

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]

    def markdown(self, skip: Sequence[str] = ()) -> str:
        """As a Markdown table (TensorBoard's text tab renders one), leaving out the columns in ``skip``."""
        keep = [i for i, column in enumerate(self.columns) if column not in skip]

        def cell(value: Any) -> str:
            text = f"{value:.4g}" if isinstance(value, float) else json.dumps(value) if isinstance(value, list) else str(value)
            return text.replace("|", "\\|").replace("\n", " ")

        lines = ["| " + " | ".join(self.columns[i] for i in keep) + " |", "|" + "---|" * len(keep)]
        lines += ["| " + " | ".join(cell(row[i]) for i in keep) + " |" for row in self.rows]
        return "\n".join(lines)


def episode_table(step: int, trajectories: Sequence[Any]) -> Table:
    """One row per episode: its identity, return, per-turn rewards and the whole conversation as text."""
    rows = []
    for t in trajectories:
        conversation = "\n\n".join(f"[{m.role}] {m.content}" for m in t.messages)
        rows.append([step, t.task_id, t.group_index, t.seed, t.total_reward, len(t.turns),
                     [float(turn.reward) for turn in t.turns], sum(turn.invalid_action for turn in t.turns),
                     t.end_reason, t.policy_version, conversation])  # fmt: skip
    return Table(list(EPISODE_COLUMNS), rows)


def comparison_table(rows: dict[str, Any], columns: Sequence[str] | None = None) -> Table:
    """The before/after/baselines table the run prints (``rows``: agent -> EvalResult): per column the mean and
    its 95% half-width, as ``evaluation.print_comparison`` shows them."""
    from rl_llm.trainers.evaluation import TABLE_METRICS

    if columns is None:  # print_comparison's default columns
        columns = ["return"] + [m for m in TABLE_METRICS if all(m in r.values for r in rows.values())]
    names = ["agent"] + [n for column in columns for n in (column, f"{column}_ci95")]
    body = [[agent, *(finite(v) for column in columns for v in result.ci95(column))] for agent, result in rows.items()]
    return Table(names, body)


def finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a record (what a tracker can chart; bools and NaN are left out, as for TensorBoard)."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}  # fmt: skip


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


class Tracker:
    """One tracker's run. ``state`` is what ``trackers.json`` keeps to reattach a resumed run."""

    name = ""
    state: dict[str, Any]

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        raise NotImplementedError

    def log_episodes(self, step: int, table: Table, trajectories: Sequence[Any]) -> None:
        raise NotImplementedError

    def log_summary(self, step: int, summary: dict[str, float], full: dict[str, Any], table: Table) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class WandbTracker(Tracker):
    """W&B: WANDB_MODE (offline: no account, `wandb sync` later), WANDB_PROJECT, WANDB_NAME, WANDB_DIR (default:
    the run directory) are honoured; episodes are a ``wandb.Table`` per step under ``episodes``."""

    name = "wandb"

    def __init__(self, run_dir: Path, config: dict[str, Any], project: str | None, run_name: str | None,
                 previous: dict[str, Any] | None) -> None:  # fmt: skip
        import wandb

        self.wandb = wandb
        directory = None if os.environ.get("WANDB_DIR") else str(run_dir)
        resume = {"id": previous["id"], "resume": "allow"} if previous and not os.environ.get("WANDB_RUN_ID") else {}
        self.run = wandb.init(project=project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
                              name=run_name or os.environ.get("WANDB_NAME") or run_dir.name, dir=directory,
                              config=config, **resume)  # fmt: skip
        self.state = {"id": self.run.id, "project": self.run.project}

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_episodes(self, step: int, table: Table, trajectories: Sequence[Any]) -> None:
        rows = [[json.dumps(v) if isinstance(v, list) else v for v in row] for row in table.rows]  # lists: as text
        self.run.log({"episodes": self.wandb.Table(columns=table.columns, data=rows)}, step=step)

    def log_summary(self, step: int, summary: dict[str, float], full: dict[str, Any], table: Table) -> None:
        self.run.summary.update(summary)
        self.run.log({"comparison": self.wandb.Table(columns=table.columns, data=table.rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


class TrackioTracker(Tracker):
    """trackio: the local SQLite store under TRACKIO_DIR (default ~/.cache/huggingface/trackio), or a Space with
    TRACKIO_SPACE_ID; episodes are ``trackio.Trace`` objects (the conversation, one span per turn with its reward)
    under ``episodes``, as TRL logs its rollouts, plus a ``trackio.Table`` under ``episodes_table``."""

    name = "trackio"

    def __init__(self, run_dir: Path, config: dict[str, Any], project: str | None, run_name: str | None,
                 previous: dict[str, Any] | None) -> None:  # fmt: skip
        import trackio

        self.trackio = trackio
        name = previous["name"] if previous else run_name or run_dir.name
        self.run = trackio.init(project=project or DEFAULT_PROJECT, name=name, config=config,
                                resume="allow" if previous else "never", embed=False)  # fmt: skip
        self.state = {"project": project or DEFAULT_PROJECT, "name": self.run.name}

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_episodes(self, step: int, table: Table, trajectories: Sequence[Any]) -> None:
        traces = [self._trace(record, t) for record, t in zip(table.records(), trajectories, strict=True)]
        self.run.log({"episodes": traces,
                      "episodes_table": self.trackio.Table(columns=table.columns, data=table.rows)}, step=step)

    def _trace(self, record: dict[str, Any], trajectory: Any) -> Any:
        """The conversation as messages, and one span per turn: what the policy saw, wrote and earned."""
        task = next((m.content for m in trajectory.messages if m.role == "user"), "")
        seen = [task] + [turn.observation for turn in trajectory.turns]
        spans = [{"id": f"turn-{i + 1}", "name": f"turn {i + 1}", "kind": "generation", "input": seen[i],
                  "output": turn.action, "metadata": {"reward": turn.reward, "invalid_action": turn.invalid_action}}
                 for i, turn in enumerate(trajectory.turns)]  # fmt: skip
        record.pop("conversation")
        return self.trackio.Trace(messages=[m.to_dict() for m in trajectory.messages], metadata=record, spans=spans)

    def log_summary(self, step: int, summary: dict[str, float], full: dict[str, Any], table: Table) -> None:
        self.run.log({**{f"summary/{k}": v for k, v in summary.items()},
                      "summary/comparison": self.trackio.Table(columns=table.columns, data=table.rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker(Tracker):
    """MLflow: MLFLOW_TRACKING_URI (default: MLflow's, ``sqlite:///mlflow.db`` in the working directory),
    MLFLOW_EXPERIMENT_NAME / _ID (default experiment: ``rl-llm``), MLFLOW_RUN_ID; the config as dotted params and
    ``config.yaml``, episodes as one ``mlflow.log_table`` JSON per step under ``episodes/``."""

    name = "mlflow"

    def __init__(self, run_dir: Path, config: dict[str, Any], project: str | None, run_name: str | None,
                 previous: dict[str, Any] | None) -> None:  # fmt: skip
        import mlflow
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        self.mlflow = mlflow
        if project or not (os.environ.get("MLFLOW_EXPERIMENT_NAME") or os.environ.get("MLFLOW_EXPERIMENT_ID")):
            mlflow.set_experiment(project or DEFAULT_PROJECT)
        reattach = previous["run_id"] if previous and not os.environ.get("MLFLOW_RUN_ID") else None
        self.run = mlflow.start_run(run_id=reattach, run_name=None if reattach else run_name or run_dir.name)
        self.run_id = self.run.info.run_id
        self.state = {"run_id": self.run_id, "tracking_uri": mlflow.get_tracking_uri()}
        if previous is None:  # params cannot change once logged
            params = {k: str(v)[:MAX_PARAM_VAL_LENGTH] for k, v in flatten(config).items()}
            items = list(params.items())
            for start in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
                mlflow.log_params(dict(items[start : start + MAX_PARAMS_TAGS_PER_BATCH]))
            mlflow.log_dict(config, "config.yaml")

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        # MLflow admits letters, digits and _-. :/ in a metric name (env metrics are free-form). Asynchronous: a
        # synchronous call is a store transaction per step (about 0.1 s on sqlite); end_run waits for the queue.
        self.mlflow.log_metrics({re.sub(r"[^0-9A-Za-z_\-. :/]", "_", k): v for k, v in metrics.items()}, step=step,
                                synchronous=False)  # fmt: skip

    def log_episodes(self, step: int, table: Table, trajectories: Sequence[Any]) -> None:
        self.mlflow.log_table({c: [row[i] for row in table.rows] for i, c in enumerate(table.columns)},
                              artifact_file=f"episodes/step_{step:06d}.json")  # fmt: skip

    def log_summary(self, step: int, summary: dict[str, float], full: dict[str, Any], table: Table) -> None:
        self.mlflow.log_metrics({f"summary/{k}": v for k, v in summary.items()}, step=step)
        self.mlflow.log_table({c: [row[i] for row in table.rows] for i, c in enumerate(table.columns)},
                              artifact_file="comparison.json")  # fmt: skip
        self.mlflow.log_dict(full, "summary.json")

    def close(self) -> None:
        self.mlflow.end_run()


CLASSES: dict[str, type[Tracker]] = {"wandb": WandbTracker, "trackio": TrackioTracker, "mlflow": MlflowTracker}


class Trackers:
    """The trackers of ``log.report_to`` other than TensorBoard, started together; each call goes to all."""

    def __init__(self, names: Sequence[str], run_dir: str | Path, config: dict[str, Any], resumed: bool,
                 project: str | None = None, run_name: str | None = None) -> None:  # fmt: skip
        self.run_dir = Path(run_dir)
        self.state_path = self.run_dir / STATE_FILE
        previous = _read_state(self.state_path) if resumed else {}
        self.trackers: list[Tracker] = []
        try:
            for name in names:
                if name not in CLASSES:
                    continue
                if (problem := report_to_problem([name])) is not None:
                    raise TrackerError(problem)
                try:
                    self.trackers.append(CLASSES[name](self.run_dir, config, project, run_name, previous.get(name)))
                except Exception as error:  # a tool's own failure (no login, a bad URI): one line, with the fix
                    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
                    raise TrackerError(f"log.report_to: {name} could not start: {first}{START_HINTS.get(name, '')}"
                                       ) from error  # fmt: skip
        except BaseException:
            self.close()
            raise
        if self.trackers:
            from rl_llm.trainers.checkpoint import write_text_atomic

            write_text_atomic(self.state_path, json.dumps({t.name: t.state for t in self.trackers}, indent=2))

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        values = scalars(metrics)
        for tracker in self.trackers:
            tracker.log_metrics(step, values)

    def log_episodes(self, step: int, trajectories: Sequence[Any]) -> None:
        table = episode_table(step, trajectories)
        for tracker in self.trackers:
            tracker.log_episodes(step, table, trajectories)

    def log_summary(self, step: int, summary: dict[str, Any], table: Table) -> None:
        headline = scalars({k: summary.get(k) for k in SUMMARY_SCALARS})
        full = json.loads(json.dumps(summary, default=str, allow_nan=True))
        for tracker in self.trackers:
            tracker.log_summary(step, headline, full, table)

    def close(self) -> None:
        trackers, self.trackers = self.trackers, []
        for tracker in reversed(trackers):
            tracker.close()


def _read_state(path: Path) -> dict[str, Any]:
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return state if isinstance(state, dict) else {}
