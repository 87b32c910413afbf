"""``rl-llm view``: one self-contained HTML page of a training run or of a trajectories JSONL.

The page needs no server and no network: the data is inlined as JSON, the plots are SVG drawn by an inline
script, the styles are inline CSS. It shows

- the training curves of ``metrics.jsonl`` (one plot per figure; more can be added from a menu),
- the before/after/baselines table of ``summary.json``,
- sampled episodes turn by turn (``samples.jsonl``, written by the trainer, or any trajectories JSONL):
  per-turn rewards and reward components, invalid actions marked, and the episode's token stream coloured
  by role: prompt, policy (the tokens the loss trains on) and env (observations the policy only reads).

Token text comes from the run's tokenizer (``RUN/model``, the summary's ``model_path`` or ``--tokenizer``);
without one the stream is rebuilt from the chat messages, with the same colours, and the page says so.
"""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from typing import Any

from rl_llm.export import check_out, number, writable
from rl_llm.types import TokenRole

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
SAMPLES_FILE = "samples.jsonl"
# Plotted first when present; every other numeric figure can be added from the page's menu.
DEFAULT_CURVES = ("reward/mean", "episode/return", "eval/return", "episode/invalid_action_frac", "env/regret", "loss/entropy",
                  "loss/kl_ref", "loss/grad_norm", "throughput/policy_tokens_per_s")
ROLE_NAMES = {int(TokenRole.PROMPT): "prompt", int(TokenRole.POLICY): "policy", int(TokenRole.ENV): "env"}
MAX_TEXT = 20_000  # characters of one action or observation kept on the page
# The page: HTML, CSS and the script that draws the plots and episodes; {{name}} marks what render() fills in.
PAGE_TEMPLATE = Path(__file__).with_name("view_page.html")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, one per line. A torn last line (a run still writing) is skipped, and
    so is any other line that is not an object: a hand-edited ``[]`` or ``5`` crashed the page's reader."""
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.strip():
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # not JSON, an int past 4,300 digits, nesting past the limit
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


def _list(record: dict[str, Any], key: str) -> list[Any]:
    """``record[key]`` where it is a list, else [] (a foreign or hand-edited record may hold anything)."""
    value = record.get(key)
    return value if isinstance(value, list) else []


def _showable(record: Any) -> bool:
    """A JSON object whose turns and messages, where they are lists, hold objects: what the page reads."""
    return isinstance(record, dict) and all(
        all(isinstance(item, dict) for item in _list(record, key)) for key in ("turns", "messages"))


def read_summary(path: Path) -> dict[str, Any]:
    """A run's summary.json; ValueError naming the file when it is not a JSON object."""
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not JSON ({error}); move it aside to view the rest of the run") from None
    if not isinstance(summary, dict):
        raise ValueError(f"{path} holds a JSON {type(summary).__name__}, not an object; move it aside to view "
                         "the rest of the run")  # fmt: skip
    return summary


# -- tokens -----------------------------------------------------------------------------------------------
class Decoder:
    """Token ids -> text with the run's tokenizer (the light ``tokenizers`` library when tokenizer.json is
    there, else transformers)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if (path / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
            self.vocab_size = tokenizer.get_vocab_size()
            self._decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
        else:
            from transformers import AutoTokenizer

            auto = AutoTokenizer.from_pretrained(str(path))
            self.vocab_size = len(auto)
            self._decode = lambda ids: auto.decode(ids, skip_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self._decode(ids)


def find_decoder(candidates: list[Path | None]) -> tuple[Decoder | None, str]:
    """The first candidate directory whose tokenizer loads, and a note saying which (or why none)."""
    tried = []
    for candidate in candidates:
        if candidate is None or not candidate.is_dir():
            continue
        if not any((candidate / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
            continue
        try:
            return Decoder(candidate), f"token text decoded with the tokenizer in {candidate}"
        except Exception as error:  # tokenizers/transformers missing (an extra) or a broken tokenizer
            tried.append(f"{candidate}: {type(error).__name__}: {error}")
    why = f" ({'; '.join(tried)})" if tried else " (no tokenizer found: pass --tokenizer MODEL_DIR)"
    return None, "token stream rebuilt from the chat messages" + why


def role_spans(record: dict[str, Any], decoder: Decoder | None) -> list[list[Any]]:
    """[[role, text, n_tokens], ...]: runs of same-role tokens, each decoded as a whole (so multi-byte
    characters split across tokens come out right)."""
    ids, roles = _list(record, "token_ids"), _list(record, "token_roles")
    if decoder is not None and ids and len(ids) == len(roles) and all(type(i) is int for i in ids):
        spans: list[list[Any]] = []
        start = 0
        for i in range(1, len(ids) + 1):
            if i == len(ids) or roles[i] != roles[start]:
                chunk = ids[start:i]
                text = decoder.decode(chunk) if max(chunk) < decoder.vocab_size else f"<{len(chunk)} tokens>"
                spans.append([ROLE_NAMES.get(roles[start], "prompt"), text, len(chunk)])
                start = i
        return spans
    # No tokenizer: the messages in order; the opening system and user messages are the prompt.
    spans = []
    seen_assistant = False
    for message in _list(record, "messages"):
        role = message.get("role")
        seen_assistant = seen_assistant or role == "assistant"
        kind = "policy" if role == "assistant" else ("env" if seen_assistant else "prompt")
        spans.append([kind, f"[{role}]\n{message.get('content', '')}\n", None])
    return spans


def _clip(text: Any) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f"\n… ({len(text) - MAX_TEXT} more characters)"


def episode_view(record: dict[str, Any], decoder: Decoder | None, label: str) -> dict[str, Any]:
    """What the page shows of one trajectory record (``Trajectory.to_json``, plus ``step`` for samples)."""
    turns = []
    for index, turn in enumerate(_list(record, "turns")):
        info = turn.get("info") if isinstance(turn.get("info"), dict) else {}
        turns.append({
            "index": index + 1, "action": _clip(turn.get("action")), "observation": _clip(turn.get("observation")),
            "reward": turn.get("reward", 0.0), "invalid": bool(turn.get("invalid_action")),
            "components": info.get("reward_components") or {}, "metrics": info.get("metrics") or {},
            "finish_reason": info.get("finish_reason"),
        })  # fmt: skip
    roles = _list(record, "token_roles")
    counts = {name: sum(1 for role in roles if role == value) for value, name in ROLE_NAMES.items()}
    total = record.get("total_reward")
    if total is None:
        total = sum(number(turn["reward"]) for turn in turns)
    spans = role_spans(record, decoder)
    for span in spans:
        span[1] = _clip(span[1])
    return {
        "label": label, "step": record.get("step"), "env_id": record.get("env_id", ""),
        "task_id": record.get("task_id", ""), "seed": record.get("seed"), "group_id": record.get("group_id", ""),
        "group_index": record.get("group_index"), "return": total, "end_reason": record.get("end_reason", ""),
        "error": record.get("error"), "metrics": record.get("metrics") or {}, "turns": turns,
        "token_counts": counts, "spans": spans, "policy_version": record.get("policy_version"),
        "seat": record.get("seat", ""), "opponent": record.get("opponent", ""),
    }  # fmt: skip


def spread(items: list[Any], count: int) -> list[Any]:
    """``count`` items evenly spread over ``items``, first and last included."""
    if count <= 0 or len(items) <= count:
        return items if count > 0 else []
    if count == 1:
        return [items[-1]]
    return [items[round(i * (len(items) - 1) / (count - 1))] for i in range(count)]


# -- loading ----------------------------------------------------------------------------------------------
def load(path: str | Path, episodes: int = 24, tokenizer: str | Path | None = None) -> dict[str, Any]:
    """Everything the page shows, from a run directory or a trajectories JSONL."""
    path = Path(path)
    notes: list[str] = []
    metrics: list[dict[str, Any]] = []
    summary: dict[str, Any] | None = None
    if path.is_dir():
        run_dir = path
        if (path / METRICS_FILE).is_file():
            metrics = read_jsonl(path / METRICS_FILE)
        if (path / SUMMARY_FILE).is_file():
            summary = read_summary(path / SUMMARY_FILE)
        sources = [path / SAMPLES_FILE] if (path / SAMPLES_FILE).is_file() else sorted(
            path.glob("*.trajectories.jsonl"))  # fmt: skip
        if not sources:
            notes.append(f"no sampled episodes in {path} (the trainer writes them to {SAMPLES_FILE})")
        if not metrics and summary is None and not sources:
            raise FileNotFoundError(f"{path} has no {METRICS_FILE}, {SUMMARY_FILE} or trajectories to show")
        title = path.resolve().name
    elif path.is_file():
        run_dir, sources, title = None, [path], path.name
    else:
        raise FileNotFoundError(f"{path}: no such run directory or trajectories file")
    read = [record for source in sources for record in read_jsonl(source)]
    records = [record for record in read if _showable(record)]
    if not records and (path.is_file() or (not metrics and summary is None)):  # nothing to show: no page
        where = ", ".join(str(source) for source in sources)
        raise ValueError(f"{where} holds no valid record (a trajectories JSONL has one JSON object per line)")
    if sources and records and not isinstance(records[0].get("turns"), list):
        sibling = path.with_suffix(".trajectories.jsonl") if path.is_file() else None
        hint = f"; the trajectories are in {sibling}" if sibling is not None and sibling.is_file() else ""
        raise ValueError(f"{sources[0]} holds episode records, not trajectories (no turns){hint}")
    if tokenizer and not Path(tokenizer).is_dir():  # not silently replaced by the messages
        raise FileNotFoundError(f"--tokenizer {tokenizer}: no such model directory")
    candidates: list[Path | None] = [Path(tokenizer) if tokenizer else None]
    if run_dir is not None and not tokenizer:  # one given is used or refused, never replaced by the run's own
        candidates.append(run_dir / "model")
    if summary and isinstance(summary.get("model_path"), str) and not tokenizer:
        candidates.append(Path(summary["model_path"]))
    decoder, token_note = find_decoder(candidates) if records else (None, "")
    if tokenizer and records and decoder is None:
        why = token_note.partition(f"{Path(tokenizer)}: ")[2].rstrip(")") or "no tokenizer.json or tokenizer_config.json there"
        raise ValueError(f"--tokenizer {tokenizer}: {why}")
    if token_note:
        notes.append(token_note)
    if not metrics and records:  # a trajectories file: plot the returns in file order instead
        metrics = [{"step": i + 1, "episode/return": record.get("total_reward")} for i, record in enumerate(records)]
        notes.append("plots: episode returns in file order (no metrics.jsonl)")
    chosen = _with_partners(spread(records, episodes), records)
    shown = _pair_seats([episode_view(record, decoder, _label(record, i)) for i, record in enumerate(chosen)])
    if len(records) > len(chosen):
        notes.append(f"showing {len(chosen)} of {len(records)} episodes, spread over the run (--episodes N)")
    return {"title": title, "source": str(path.resolve()), "metrics": _numeric(metrics), "summary": summary,
            "episodes": shown, "notes": notes, "default_curves": list(DEFAULT_CURVES)}


def _label(record: dict[str, Any], index: int) -> str:
    step = record.get("step")
    where = f"step {step}" if step is not None else f"episode {index + 1}"
    seat = f" · {record['seat']} vs {record.get('opponent') or '?'}" if record.get("seat") else ""
    return f"{where} · {record.get('env_id', '')} seed {record.get('seed')}{seat}"


def _match_key(record: dict[str, Any]) -> str | None:
    """The match a two-player game's seat record belongs to (None for single-agent records); a repr, as a
    group_id read from JSON may be a list, which no set or dict key can be."""
    if not record.get("seat"):
        return None
    return repr((record.get("step"), record.get("group_id"), record.get("group_index")))


def _with_partners(chosen: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``chosen`` plus the other seat of every chosen match, so both seats are shown."""
    keys = {_match_key(record) for record in chosen} - {None}
    if not keys:
        return chosen
    picked = {id(record) for record in chosen}
    return [record for record in records if id(record) in picked or _match_key(record) in keys]


def _pair_seats(shown: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Seats of one match side by side: one ``{"match": [seat views...]}`` entry per match, in seat order."""
    matches: dict[str, dict[str, Any]] = {}
    out: list[dict[str, Any]] = []
    for view in shown:
        if not view.get("seat"):
            out.append(view)
            continue
        key = _match_key(view)
        if key not in matches:
            matches[key] = {"match": [], "label": view["label"]}
            out.append(matches[key])
        matches[key]["match"].append(view)
    for entry in matches.values():
        entry["match"].sort(key=lambda view: view["seat"])
    return out


def _numeric(metrics: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Only finite numbers survive JSON for the plots (NaN is not JSON)."""
    keep = []
    for record in metrics:
        keep.append({key: value for key, value in record.items()
                     if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(number(value))})
    return keep


# -- the page ---------------------------------------------------------------------------------------------
def summary_html(summary: dict[str, Any] | None) -> str:
    """The before/after/baselines table, rendered here (it needs no script)."""
    if not summary:
        return ""
    rows: list[tuple[str, dict[str, Any]]] = []
    # The same names as the trainer's table (trainers/runner.py): in a warm-started run `before` is the
    # policy after SFT and `untrained` the one before it.
    if isinstance(summary.get("untrained"), dict):
        rows.append(("untrained policy", summary["untrained"]))
    if isinstance(summary.get("before"), dict):
        rows.append(("after SFT" if isinstance(summary.get("untrained"), dict) else "untrained policy",
                     summary["before"]))
    if isinstance(summary.get("after"), dict):
        rows.append((f"trained ({summary.get('algorithm', '')}, {summary.get('steps', '?')} steps)", summary["after"]))
    baselines = summary.get("baselines")
    for name, values in (baselines if isinstance(baselines, dict) else {}).items():
        if isinstance(values, dict):
            rows.append((name, values))
    columns = list(dict.fromkeys(key for _, values in rows for key in values))
    if "return" in columns:
        columns.remove("return")
        columns.insert(0, "return")
    head = "".join(f"<th>{html.escape(column)}</th>" for column in columns)
    body = "".join(
        f"<tr><td>{html.escape(name)}</td>" + "".join(f"<td class=num>{_fmt(values.get(column))}</td>"
                                                        for column in columns) + "</tr>"
        for name, values in rows
    )  # fmt: skip
    facts = [(key, summary.get(key)) for key in ("env_id", "algorithm", "steps", "eval_seeds", "wall_time_s",
                                                 "model_path", "resumed_from_step") if key in summary]
    facts_html = "".join(f"<dt>{html.escape(key)}</dt><dd>{html.escape(_plain(value))}</dd>" for key, value in facts)
    return (f"<section id=summary><h2>Summary</h2><dl class=facts>{facts_html}</dl>"
            f"<table class=summary><thead><tr><th>agent</th>{head}</tr></thead><tbody>{body}</tbody></table></section>")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return html.escape(_plain(value))


def _plain(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list) and len(value) == 2:
        return f"{value[0]} … {value[1]}"
    return "" if value is None else str(value)


def render(data: dict[str, Any]) -> str:
    """The whole page. The data is inlined as JSON with every '<' escaped, so no text can end the script."""
    data = writable(data)  # NaN would make the page's JSON.parse fail, a lone surrogate the UTF-8 write
    payload = json.dumps({key: value for key, value in data.items() if key != "summary"}, ensure_ascii=False)
    payload = payload.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    notes = "".join(f"<li>{html.escape(note)}</li>" for note in data["notes"])
    parts = {"title": html.escape(data["title"]), "source": html.escape(data["source"]),
             "notes": f"<ul class=notes>{notes}</ul>" if notes else "",
             "summary": summary_html(data.get("summary")), "data": payload}
    # One pass, so nothing inserted (a title, an episode's text) is itself read as a placeholder.
    return re.sub(r"\{\{(\w+)\}\}", lambda match: parts[match.group(1)], PAGE_TEMPLATE.read_text(encoding="utf-8"))


def write_view(path: str | Path, out: str | Path | None = None, episodes: int = 24,
               tokenizer: str | Path | None = None) -> Path:
    """Write the page for a run directory or trajectories JSONL; returns its path (default: RUN/view.html,
    or the JSONL's path with .html)."""
    path = Path(path)
    target = Path(out) if out else (path / "view.html" if path.is_dir() else path.with_suffix(".html"))
    # what is read (a file's path joined with these names is nothing): never overwritten by the page
    check_out(target, [path, *(path / name for name in (METRICS_FILE, SUMMARY_FILE, SAMPLES_FILE)),
                       *path.glob("*.trajectories.jsonl")])  # fmt: skip
    data = load(path, episodes=episodes, tokenizer=tokenizer)
    from rl_llm.paths import atomic_path

    with atomic_path(target) as partial:
        partial.write_text(render(data), encoding="utf-8")
    return target
