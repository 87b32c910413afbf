"""``log.report_to``: a tiny training run reports to TensorBoard, W&B (offline), trackio and MLflow (local stores),
and each tracker's own store, read back, holds the run's scalars, config, sampled episodes and summary."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rl_llm.trainers.cli import train_main
from rl_llm.trainers.config import ConfigError, load_config
from rl_llm.trainers.logging import read_metrics
from rl_llm.trainers.trackers import TrackerError, Trackers

REPO = Path(__file__).resolve().parents[2]
TRACKERS = ("wandb", "trackio", "mlflow")
PROJECT, RUN_NAME, STEPS = "rl-llm-test", "tiny-run", 2
# The default job (a 4-turn bandit, so episodes have several per-turn rewards), shortened, without its warm start.
OVERRIDES = [f"steps={STEPS}", "sft.episodes=0", "eval.episodes=2", "eval.baselines=[random]",
             "rollout.prompts_per_step=2", "rollout.group_size=2", "log.samples=2", "log.progress=false",
             "log.plot=false", f"log.project={PROJECT}", f"log.run_name={RUN_NAME}"]  # fmt: skip
# Variables that would send a tracker elsewhere than this test's local stores.
FOREIGN = ("WANDB_DIR", "WANDB_PROJECT", "WANDB_NAME", "WANDB_RUN_ID", "WANDB_API_KEY", "MLFLOW_RUN_ID",
           "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID", "TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL")  # fmt: skip


def installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def need(name: str, extra: str | None = None) -> None:
    if not installed(name):
        pytest.skip(f"{name} is not installed (pip install 'rl-llm[{extra or name}]')")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One training run reporting to every installed tracker (one run keeps the shared CPUs free), in a
    subprocess: trackio reads TRACKIO_DIR when it is imported."""
    names = [name for name in TRACKERS if installed(name)]
    if not names:
        pytest.skip(f"none of {', '.join(TRACKERS)} is installed (pip install 'rl-llm[wandb]' etc.)")
    names += ["tensorboard"] if installed("tensorboard") else []
    root = tmp_path_factory.mktemp("trackers")
    run_dir = root / "run"
    env = {k: v for k, v in os.environ.items() if k not in FOREIGN}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", HF_HUB_OFFLINE="1", TRACKIO_DIR=str(root / "trackio"),
               MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}", PYTHONUNBUFFERED="1")  # fmt: skip
    command = [sys.executable, "-m", "rl_llm.cli", "train", *OVERRIDES,
               f"log.report_to=[{', '.join(names)}]", "--out", str(run_dir)]  # fmt: skip
    # cwd: MLflow puts a sqlite store's artifacts under ./mlruns
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    return {"root": root, "dir": run_dir, "metrics": read_metrics(run_dir / "metrics.jsonl"), "samples": samples,
            "config": yaml.safe_load((run_dir / "config.yaml").read_text()),
            "summary": json.loads((run_dir / "summary.json").read_text())}  # fmt: skip


def expected_episodes(run: dict[str, Any]) -> list[tuple[int, str, list[float]]]:
    """(step, task_id, per-turn rewards) of each sampled episode, as samples.jsonl holds them."""
    return [(s["step"], s["task_id"], [t["reward"] for t in s["turns"]]) for s in run["samples"]]


def per_step(run: dict[str, Any], key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in run["metrics"]]


# -- W&B ----------------------------------------------------------------------------------------------------
def wandb_records(path: str) -> list[Any]:
    """The records of a .wandb transaction log (LevelDB's log format: 32 KiB blocks of chunks with a 7-byte
    header), parsed with the protobuf classes of wandb's SDK."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", "not a .wandb file"
    records, position, pending, block = [], 7, b"", 32768
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def key(item: Any) -> str:
    """A history or summary item's name (W&B keeps names holding '/' in ``nested_key``)."""
    return item.key or "/".join(item.nested_key)


def test_wandb_offline_run_holds_the_scalars_config_episodes_and_summary(run: dict[str, Any]) -> None:
    need("wandb")
    (path,) = glob.glob(str(run["dir"] / "wandb" / "offline-run-*" / "run-*.wandb"))  # dir: the run directory
    records = wandb_records(path)
    (start,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (start.project, start.display_name) == (PROJECT, RUN_NAME)
    config = {item.key: json.loads(item.value_json) for item in start.config.update}
    assert config["algorithm"] == run["config"]["algorithm"] and config["optim"] == run["config"]["optim"]
    assert config["log"]["report_to"] == run["config"]["log"]["report_to"]
    history = [{key(i): json.loads(i.value_json) for i in r.history.item} for r in records
               if r.WhichOneof("record_type") == "history"]  # fmt: skip
    assert [(h["_step"], h["reward/mean"]) for h in history if "reward/mean" in h] == per_step(run, "reward/mean")
    assert [(h["_step"], h["loss/policy_loss"]) for h in history if "loss/policy_loss" in h] == per_step(
        run, "loss/policy_loss")
    # The sampled episodes: a table per step, the same episodes and per-turn rewards as samples.jsonl.
    tables = sorted(glob.glob(str(Path(path).parent / "files" / "media" / "table" / "episodes_*.table.json")),
                    key=lambda p: int(Path(p).name.split("_")[1]))  # fmt: skip
    assert len(tables) == STEPS
    episodes = []
    for table_path in tables:
        table = json.loads(Path(table_path).read_text())
        rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
        episodes += [(r["step"], r["task_id"], json.loads(r["turn_rewards"])) for r in rows]
        assert all(r["conversation"].startswith("[system]") for r in rows)
    assert episodes == expected_episodes(run)
    assert max(len(rewards) for _, _, rewards in episodes) > 1  # multi-turn: one reward per turn
    summary = {key(i): json.loads(i.value_json) for r in records if r.WhichOneof("record_type") == "summary"
               for i in r.summary.update}  # fmt: skip
    assert summary["return_after"] == pytest.approx(run["summary"]["return_after"])
    comparison = glob.glob(str(Path(path).parent / "files" / "media" / "table" / "comparison_*.table.json"))
    assert [row[0] for row in json.loads(Path(comparison[0]).read_text())["data"]][-1] == "random"


# -- trackio ------------------------------------------------------------------------------------------------
def test_trackio_local_store_holds_the_scalars_config_traces_and_summary(run: dict[str, Any],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    need("trackio")
    from trackio import sqlite_storage

    monkeypatch.setattr(sqlite_storage, "TRACKIO_DIR", run["root"] / "trackio")  # read at trackio's import
    storage = sqlite_storage.SQLiteStorage
    assert storage.get_project_db_path(PROJECT).is_file()
    assert storage.get_runs(PROJECT) == [RUN_NAME]
    logs = storage.get_logs(PROJECT, RUN_NAME)
    assert [(row["step"], row["reward/mean"]) for row in logs if "reward/mean" in row] == per_step(run, "reward/mean")
    config = storage.get_run_config(PROJECT, RUN_NAME)
    assert config["algorithm"] == run["config"]["algorithm"] and config["rollout"] == run["config"]["rollout"]
    # The sampled episodes as traces: the conversation, and one span per turn with its reward.
    traces = sorted(storage.get_traces(PROJECT, RUN_NAME), key=lambda t: (t["step"], t["index"]))
    got = [(t["step"], t["metadata"]["task_id"], [s["metadata"]["reward"] for s in t["spans"]]) for t in traces]
    assert got == expected_episodes(run)
    assert all(t["metadata"]["turn_rewards"] == [s["metadata"]["reward"] for s in t["spans"]] for t in traces)
    first = run["samples"][0]
    assert traces[0]["messages"] == first["messages"]
    assert traces[0]["spans"][0]["output"] == first["turns"][0]["action"]
    summary = [row for row in logs if "summary/return_after" in row]
    assert summary and summary[-1]["summary/return_after"] == pytest.approx(run["summary"]["return_after"])
    table = summary[-1]["summary/comparison"]["_value"]
    assert [row["agent"] for row in table][-1] == "random"


# -- MLflow -------------------------------------------------------------------------------------------------
def test_mlflow_sqlite_store_holds_the_scalars_config_episodes_and_summary(run: dict[str, Any]) -> None:
    need("mlflow")
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run['root'] / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(PROJECT)
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.run_name == RUN_NAME and found.info.status == "FINISHED"
    history = client.get_metric_history(found.info.run_id, "reward/mean")
    assert sorted((m.step, m.value) for m in history) == per_step(run, "reward/mean")
    params = found.data.params
    assert params["algorithm"] == run["config"]["algorithm"]
    assert float(params["optim.lr"]) == run["config"]["optim"]["lr"]
    assert params["env.kwargs.horizon"] == str(run["config"]["env"]["kwargs"]["horizon"])
    artifacts = run["root"] / "downloads"
    config = yaml.safe_load(Path(client.download_artifacts(found.info.run_id, "config.yaml", str(artifacts))).read_text())
    assert config == run["config"]
    episodes = []
    for step in range(1, STEPS + 1):
        table = json.loads(Path(client.download_artifacts(found.info.run_id, f"episodes/step_{step:06d}.json",
                                                          str(artifacts))).read_text())  # fmt: skip
        rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
        episodes += [(r["step"], r["task_id"], r["turn_rewards"]) for r in rows]
    # log_table writes through pandas' to_json, which keeps 10 significant digits
    assert [(step, task) for step, task, _ in episodes] == [(step, task) for step, task, _ in expected_episodes(run)]
    assert all(got == pytest.approx(want, rel=1e-9) for (*_, got), (*_, want) in zip(episodes, expected_episodes(run)))
    assert found.data.metrics["summary/return_after"] == pytest.approx(run["summary"]["return_after"])
    comparison = json.loads(Path(client.download_artifacts(found.info.run_id, "comparison.json",
                                                           str(artifacts))).read_text())  # fmt: skip
    assert comparison["columns"][:3] == ["agent", "return", "return_ci95"]


# -- TensorBoard and the config check ----------------------------------------------------------------------
def test_tensorboard_gets_the_config_episodes_and_summary_as_text(run: dict[str, Any]) -> None:
    need("tensorboard", "llm")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run["dir"] / "tensorboard"), size_guidance={"tensors": 0}).Reload()
    assert [e.step for e in events.Scalars("reward/mean")] == [step for step, _ in per_step(run, "reward/mean")]
    texts = {tag: [e.tensor_proto.string_val[0].decode() for e in events.Tensors(tag)]
             for tag in events.Tags()["tensors"]}  # fmt: skip
    assert "algorithm: grpo" in texts["config/text_summary"][0]
    assert len(texts["episodes/text_summary"]) == STEPS and "| turn_rewards |" in texts["episodes/text_summary"][0]
    assert "| random |" in texts["summary/comparison/text_summary"][0]


def test_a_tracker_that_is_not_installed_is_refused_when_the_config_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Uninstalling a package is out of a test's reach: find_spec answers "not installed" for wandb instead.
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError) as refused:
        load_config(overrides=["log.report_to=[tensorboard, wandb]"])
    assert str(refused.value) == "log.report_to: wandb is not installed; pip install 'rl-llm[wandb]'"
    with pytest.raises(ConfigError, match="'comet' is not one of"):
        load_config(overrides=["log.report_to=[comet]"])
    with pytest.raises(ConfigError, match="named twice"):
        load_config(overrides=["log.report_to=[mlflow, mlflow]"])
    assert load_config(overrides=["log.report_to=[]"]).log.report_to == []
    assert train_main(None, ["log.report_to=[wandb]"], out=str(tmp_path)) == 2  # the CLI: one line, no traceback
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        "error: log.report_to: wandb is not installed; pip install 'rl-llm[wandb]'")
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_resumed_run_logs_into_the_same_tracker_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need("mlflow")
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for name in FOREIGN:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # the store's artifacts: ./mlruns
    for resumed, step in [(False, 1), (True, 2)]:  # a run, then its resume from the same run directory
        trackers = Trackers(["tensorboard", "mlflow"], tmp_path / "run", {"algorithm": "grpo"}, resumed=resumed,
                            project=PROJECT)  # fmt: skip
        trackers.log_metrics(step, {"reward/mean": float(step), "flag": True})
        trackers.close()
    client = MlflowClient(tracking_uri=uri)
    (found,) = client.search_runs([client.get_experiment_by_name(PROJECT).experiment_id])
    assert [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, "reward/mean")] == [(1, 1.0), (2, 2.0)]
    assert "flag" not in found.data.metrics and found.info.run_name == "run"  # the run directory's name
    assert json.loads((tmp_path / "run" / "trackers.json").read_text())["mlflow"]["run_id"] == found.info.run_id


def test_a_tracker_that_cannot_start_stops_the_run_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://nowhere")
    with pytest.raises(TrackerError) as refused:
        Trackers(["mlflow"], tmp_path, {}, resumed=False)
    message = str(refused.value)
    assert message.startswith("log.report_to: mlflow could not start: ") and "\n" not in message
    assert message.endswith("(unset MLFLOW_TRACKING_URI for MLflow's local sqlite store)")
    assert not (tmp_path / "trackers.json").exists()
