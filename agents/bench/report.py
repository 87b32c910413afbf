"""Results of a benchmark run: ``results.json``, a markdown table and a bar plot of normalized scores.

Per entry: ``score`` (mean return) with ``ci95`` (half-width of its 95% Student-t interval), ``normalized``
= (score - random) / (reference - random) with its interval scaled the same way, the success rate where the
suite names a success metric, the invalid-action rate (invalid turns / turns), tokens generated (estimated
at 4 characters a token for chat-only backends, flagged ``tokens_estimated``) and the episode counts.
``aggregate.normalized`` is the mean over the entries that have a normalized score.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import rl_llm
from rl_llm.agents.bench.episodes import jobs_for
from rl_llm.agents.bench.suite import Suite
from rl_llm.agents.evaluate import mean_ci95
from rl_llm.paths import atomic_path


def _finite(value: float) -> float | None:
    return None if value is None or math.isnan(value) else float(value)


def build_results(suite: Suite, agent: str, done: dict[str, dict[str, Any]], references: dict[str, dict[str, Any]],
                  unavailable: dict[str, str], state: Any) -> dict[str, Any]:  # fmt: skip
    from rl_llm.agents.bench.runner import opponents_of

    envs: dict[str, dict[str, Any]] = {}
    for entry in suite.envs:
        jobs = jobs_for(entry, opponents_of(entry))
        records = [done[job.id] for job in jobs if job.id in done]
        row: dict[str, Any] = {"env": entry.env, "kwargs": entry.kwargs, "planned": len(jobs),
                               "episodes": len(records), "errors": len(state.errors.get(entry.key, []))}  # fmt: skip
        if entry.key in unavailable:
            row["unavailable"] = unavailable[entry.key]
        reference = references.get(entry.key)
        if reference is not None:
            row.update(random=reference["random"], reference=reference["reference"],
                       reference_agent=reference["reference_agent"])  # fmt: skip
        if records:
            score, half = mean_ci95(record["episode_return"] for record in records)
            turns = sum(record["turns"] for record in records)
            successes = [record["success"] for record in records if record.get("success") is not None]
            row.update(
                score=score, ci95=_finite(half),
                success_rate=statistics.fmean(successes) if successes else None,
                invalid_action_rate=sum(record["invalid_actions"] for record in records) / turns if turns else None,
                tokens=sum(record.get("tokens", 0) for record in records),
                tokens_estimated=any(record.get("tokens_estimated") for record in records),
            )  # fmt: skip
            if reference is not None and reference["reference"] != reference["random"]:
                span = reference["reference"] - reference["random"]
                row["normalized"] = (score - reference["random"]) / span
                row["normalized_ci95"] = None if math.isnan(half) else half / abs(span)
            else:
                row["normalized"] = None  # the reference does no better than random here: nothing to scale by
        if state.errors.get(entry.key):
            row["first_error"] = state.errors[entry.key][0]
        envs[entry.key] = row
    normalized = [row["normalized"] for row in envs.values() if row.get("normalized") is not None]
    complete = all(row["episodes"] == row["planned"] for row in envs.values() if "unavailable" not in row)
    return {
        "suite": suite.name,
        "suite_version": suite.version,
        "agent": agent,
        "rl_llm_version": rl_llm.__version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "complete": complete,
        "stopped": state.stopped,
        "tokens": sum(row.get("tokens", 0) for row in envs.values()),
        "aggregate": {
            "normalized": statistics.fmean(normalized) if normalized else None,
            "envs": len(normalized),
        },
        "envs": envs,
    }


def _cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown_table(results: dict[str, Any]) -> str:
    """A GitHub-flavoured markdown table, one row per entry, then the aggregate."""
    lines = [
        f"**{results['agent']}** on suite `{results['suite']}-v{results['suite_version']}` "
        f"(rl-llm {results['rl_llm_version']}){'' if results['complete'] else ' (incomplete)'}",
        "",
        "| env | episodes | score ± 95% CI | random | reference | normalized | success | invalid | tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, row in results["envs"].items():
        if "unavailable" in row:
            lines.append(f"| {key} | 0/{row['planned']} | unavailable: {row['unavailable'][:80]} ||||||")
            continue
        score = _cell(row.get("score")) + ("" if row.get("ci95") is None else f" ± {row['ci95']:.2f}")
        reference = _cell(row.get("reference")) + (
            f" ({row['reference_agent']})" if "reference_agent" in row else ""
        )
        tokens = (
            "-" if "tokens" not in row else f"{'~' if row.get('tokens_estimated') else ''}{row['tokens']}"
        )
        lines.append(f"| {key} | {row['episodes']}/{row['planned']} | {score} | {_cell(row.get('random'))} | "
                     f"{reference} | {_cell(row.get('normalized'))} | {_cell(row.get('success_rate'))} | "
                     f"{_cell(row.get('invalid_action_rate'))} | {tokens} |")  # fmt: skip
    aggregate = results["aggregate"]
    lines.append(f"| **aggregate** ({aggregate['envs']} envs) | | | | | **{_cell(aggregate['normalized'])}** | | | "
                 f"{results['tokens']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot_normalized(results: dict[str, Any], path: Path) -> Path:
    """Horizontal bars of the normalized score per entry (95% intervals), the aggregate last."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(key, row) for key, row in results["envs"].items() if row.get("normalized") is not None]
    names = [key for key, _ in rows] + ["aggregate"]
    values = [row["normalized"] for _, row in rows] + [results["aggregate"]["normalized"] or 0.0]
    errors = [row.get("normalized_ci95") or 0.0 for _, row in rows] + [0.0]
    figure, axis = plt.subplots(figsize=(8, 0.4 * len(names) + 1.5))
    colors = ["#4c72b0"] * len(rows) + ["#c44e52"]
    axis.barh(names, values, xerr=errors, color=colors, capsize=3)
    axis.axvline(0.0, color="grey", linewidth=0.8)
    axis.axvline(1.0, color="grey", linewidth=0.8, linestyle="--")
    axis.invert_yaxis()
    axis.set(xlabel="normalized score (0 = random, 1 = oracle / best baseline)",
             title=f"{results['agent']} on {results['suite']}-v{results['suite_version']}")  # fmt: skip
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def write_reports(results: dict[str, Any], out: Path) -> dict[str, Path]:
    paths = {"json": out / "results.json", "markdown": out / "results.md"}
    with atomic_path(paths["json"]) as partial:
        partial.write_text(json.dumps(results, indent=1, ensure_ascii=False), encoding="utf-8")
    with atomic_path(paths["markdown"]) as partial:
        partial.write_text(markdown_table(results), encoding="utf-8")
    with contextlib.suppress(ImportError):  # matplotlib comes with the llm extra
        paths["plot"] = plot_normalized(results, out / "normalized.png")
    return paths
