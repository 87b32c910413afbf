"""`rl-llm export`: trajectory files and run directories as chat-format SFT JSONL, parquet and a Hugging Face
dataset, with the rejection-sampling filters, and one-line errors for what cannot be exported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rl_llm.cli import main
from rl_llm.export import export, read_sft_jsonl
from rl_llm.types import Message, Trajectory, Turn
from tests.cli_env import cli_env


def rl_llm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rl_llm.cli", *args], capture_output=True, text=True, timeout=300,
                          env=cli_env(COLUMNS="200"))  # fmt: skip


def episode(seed: int, rewards: list[float], index: int = 0, invalid: tuple[int, ...] = (), error: str | None = None,
            group: str | None = None) -> Trajectory:  # fmt: skip
    """A two-message prompt, then one answer and observation per reward (the last observation is "")."""
    messages = [Message("system", "be brief"), Message("user", f"task {seed}")]
    turns = []
    for i, reward in enumerate(rewards):
        observation = "" if i == len(rewards) - 1 else f"obs {i}"
        messages.append(Message("assistant", f"<move>{seed}-{index}-{i}</move>"))
        if observation:
            messages.append(Message("user", observation))
        turns.append(Turn(action=messages[-1 if not observation else -2].content, observation=observation,
                          reward=reward, invalid_action=i in invalid))  # fmt: skip
    return Trajectory(env_id="rl-llm/Toy-v0", task_id=f"t{seed}", seed=seed, messages=messages, turns=turns,
                      group_id=group or f"t{seed}|seed={seed}", group_index=index, end_reason="terminated",
                      error=error, metrics={"win": float(sum(rewards) > 0)})  # fmt: skip


@pytest.fixture
def trajectories(tmp_path: Path) -> Path:
    """Two GRPO groups of three, one invalid turn, one errored episode, written like `rl-llm eval` does."""
    episodes = [
        episode(0, [0.0, 1.0], 0), episode(0, [0.0, -1.0], 1, invalid=(0,)), episode(0, [0.5, 1.0], 2),
        episode(1, [0.0, 0.0], 0), episode(1, [0.0, 0.2], 1), episode(1, [3.0], 2, error="generation failed: boom"),
    ]  # fmt: skip
    path = tmp_path / "eval.trajectories.jsonl"
    path.write_text("".join(t.to_json() + "\n" for t in episodes), encoding="utf-8")
    return path


def test_sft_jsonl_is_standard_chat_messages_with_the_policy_turns_marked(trajectories: Path) -> None:
    done = export(trajectories, "sft-jsonl")
    assert done.out == trajectories.with_name("eval.trajectories.sft.jsonl") and done.errored == 1
    rows = [json.loads(line) for line in done.out.read_text().splitlines()]
    assert len(rows) == 5  # the errored episode is never exported
    first = rows[0]
    assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert all(set(m) == {"role", "content"} for m in first["messages"] if m["role"] != "assistant")
    assert [(m["content"], m["reward"], m["train"]) for m in first["messages"] if m["role"] == "assistant"] == [
        ("<move>0-0-0</move>", 0.0, True), ("<move>0-0-1</move>", 1.0, True)]  # fmt: skip
    assert first["return"] == 1.0 and first["group_id"] == "t0|seed=0" and first["env_id"] == "rl-llm/Toy-v0"
    # An invalid action is kept as context but not marked for training.
    assert [m["train"] for m in rows[1]["messages"] if m["role"] == "assistant"] == [False, True]
    assert read_sft_jsonl(done.out) == rows  # the warm start's reader takes the file as written


def test_rejection_sampling_filters(trajectories: Path, tmp_path: Path) -> None:
    best = export(trajectories, "sft-jsonl", tmp_path / "best.jsonl", best_per_group=True)
    assert [(row["seed"], row["group_index"], row["return"]) for row in best.rows] == [
        (0, 2, 1.5),
        (1, 1, 0.2),
    ]
    both = export(trajectories, "sft-jsonl", tmp_path / "both.jsonl", best_per_group=True, min_return=1.0)
    assert [(row["seed"], row["return"]) for row in both.rows] == [(0, 1.5)] and both.filtered == 4
    kept = export(trajectories, "sft-jsonl", tmp_path / "min.jsonl", min_return=0.0)
    assert sorted(row["return"] for row in kept.rows) == [0.0, 0.2, 1.0, 1.5]
    with pytest.raises(ValueError, match=r"no episode passes the filters \(best return 1.5\)"):
        export(trajectories, "sft-jsonl", tmp_path / "none.jsonl", min_return=2.0)


def test_training_samples_group_per_step_and_run_directories_are_found(tmp_path: Path) -> None:
    # samples.jsonl lines are trajectories with a "step"; the same group id at two steps is two groups.
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": step, **json.loads(episode(7, [r], i, group="g").to_json())}
             for step, rewards in ((1, (0.0, 1.0)), (2, (2.0, 0.5))) for i, r in enumerate(rewards)]  # fmt: skip
    (run / "samples.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = export(run, "sft-jsonl", best_per_group=True)
    assert done.out == run / "export.sft.jsonl"
    assert [(row["step"], row["return"]) for row in done.rows] == [(1, 1.0), (2, 2.0)]


def test_a_bench_episode_log_is_read_through_its_trajectories(trajectories: Path, tmp_path: Path) -> None:
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "episodes.trajectories.jsonl").write_text(trajectories.read_text())
    (bench / "episodes.jsonl").write_text(json.dumps({"id": "toy/0", "episode_return": 1.0}) + "\n")
    done = export(bench / "episodes.jsonl", "sft-jsonl")
    assert len(done.rows) == 5 and done.out == bench / "episodes.sft.jsonl"
    assert any("episodes.trajectories.jsonl" in note for note in done.notes)
    assert len(export(bench, "sft-jsonl").rows) == 5  # the run directory: its *.trajectories.jsonl


def test_parquet_and_hf_hold_the_same_rows(trajectories: Path, tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    datasets = pytest.importorskip("datasets")

    def arrow(
        row: dict,
    ) -> dict:  # Arrow gives every message the union of keys: null where a message has none
        keys = ("role", "content", "reward", "train")
        return {**row, "messages": [{key: m.get(key) for key in keys} for m in row["messages"]]}

    rows = [arrow(row) for row in export(trajectories, "sft-jsonl", tmp_path / "x.jsonl").rows]
    assert pq.read_table(export(trajectories, "parquet", tmp_path / "x.parquet").out).to_pylist() == rows
    dataset = datasets.load_from_disk(str(export(trajectories, "hf", tmp_path / "x.hf").out))
    assert dataset.to_list() == rows
    assert dataset.features["messages"].feature["train"].dtype == "bool"


def test_the_command_line_exports_and_says_what_it_left_out(trajectories: Path, tmp_path: Path) -> None:
    out = tmp_path / "sft.jsonl"
    result = rl_llm(
        "export", str(trajectories), "--format", "sft-jsonl", "--out", str(out), "--min-return", "0.5"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        f"exported 2 of 6 episodes (sft-jsonl) to {out}; 1 ended on an error, 3 filtered out" in result.stdout
    )
    assert len(out.read_text().splitlines()) == 2


@pytest.mark.parametrize(("make", "message"), [
    (lambda tmp: tmp / "missing", "no such trajectories file or run directory"),
    (lambda tmp: (tmp / "junk.jsonl", (tmp / "junk.jsonl").write_text("not json\n[1, 2]\n{}\n"))[0],
     "holds 3 non-empty line(s), none of them a trajectory record"),
    (lambda tmp: (tmp / "empty.jsonl", (tmp / "empty.jsonl").write_text(""))[0], "holds no line"),
    (lambda tmp: (tmp / "empty-run", (tmp / "empty-run").mkdir())[0], "holds no samples.jsonl"),
])  # fmt: skip
def test_what_cannot_be_exported_fails_on_one_line(make, message: str, tmp_path: Path) -> None:
    result = rl_llm("export", str(make(tmp_path)), "--format", "sft-jsonl")
    assert result.returncode == 2 and message in result.stdout, result.stdout + result.stderr
    assert len(result.stdout.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not list(tmp_path.glob("*.sft.jsonl"))


@pytest.mark.parametrize(("fmt", "package"), [("hf", "datasets"), ("parquet", "pyarrow")])
def test_a_missing_optional_package_names_the_pip_command(fmt: str, package: str, trajectories: Path,
                                                         monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # fmt: skip
    for name in list(sys.modules):
        if name == package or name.startswith(package + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)  # import fails as if it were not installed
    assert main(["export", str(trajectories), "--format", fmt]) == 2
    out = capsys.readouterr().out
    assert f"--format {fmt} needs the {package} package: pip install 'rl-llm[export]'" in out
    assert len(out.strip().splitlines()) == 1


def test_trl_sft_trainer_takes_the_sft_jsonl_as_it_is(trajectories: Path, tmp_path: Path) -> None:
    """The `messages` column is TRL's conversational format: SFTTrainer tokenises it with the chat template
    (the extra reward/train keys on assistant messages are ignored)."""
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl_llm.agents.tiny import tiny_model

    path = str(tiny_model())
    data = datasets.load_dataset("json", data_files=str(export(trajectories, "sft-jsonl").out), split="train")
    args = trl.SFTConfig(output_dir=str(tmp_path / "trl"), max_steps=1, report_to=[], use_cpu=True,
                         save_strategy="no", disable_tqdm=True)  # fmt: skip
    trainer = trl.SFTTrainer(model=AutoModelForCausalLM.from_pretrained(path), args=args, train_dataset=data,
                             processing_class=AutoTokenizer.from_pretrained(path))  # fmt: skip
    tokenized = trainer.train_dataset
    assert tokenized.num_rows == 5 and all(len(ids) > 20 for ids in tokenized["input_ids"])


def test_hostile_records_are_skipped_or_written_plainly_never_a_traceback(trajectories: Path, tmp_path: Path) -> None:
    """Lines that only look like trajectories (a turn or message that is no object) are skipped and counted;
    fields of the wrong type or size, NaN and lone surrogates are written as plain values. Each was a
    traceback (AttributeError, OverflowError, TypeError) or an unspecific error line before."""
    good = json.loads(trajectories.read_text().splitlines()[0])

    def variant(**fields: object) -> str:
        return json.dumps({**good, **fields}) + "\n"

    huge = 10**400  # valid JSON, past float's range
    lines = [
        variant(turns=[1, 2]), variant(messages=["hello"]), variant(turns=[None]),  # skipped: not trajectories
        variant(total_reward=huge, metrics={"win": huge, "loss": [1]}, group_id=["a"]),  # group_id: unhashable
        variant(total_reward=None, turns=[{**good["turns"][0], "reward": float("nan")}, {"reward": "x"}],
                metrics=[1, 2], group_id="nan"),
        variant(messages=[*good["messages"], {"role": "user", "content": "lone \ud800 surrogate"}], group_id="text"),
    ]  # fmt: skip
    path = tmp_path / "hostile.trajectories.jsonl"
    path.write_text("".join(lines), encoding="utf-8")
    result = rl_llm("export", str(path), "--format", "sft-jsonl", "--out", str(tmp_path / "out.jsonl"),
                    "--best-per-group")  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "exported 3 of 3 episodes" in result.stdout and "3 line(s) not a trajectory" in result.stdout
    path.write_text("".join(lines[4:]), encoding="utf-8")  # Arrow takes no list group_id beside text ones
    result = rl_llm("export", str(path), "--format", "parquet", "--out", str(tmp_path / "out.parquet"))
    assert result.returncode == 0 and "exported 2 of 2 episodes" in result.stdout, result.stdout + result.stderr
    rows = [json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in the JSONL")) for line in
            (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]  # fmt: skip
    assert [row["return"] for row in rows] == [None, None, 1.0]  # huge: inf, then null; NaN + 0 (for "x")
    assert rows[0]["metrics"] == {"win": None} and rows[1]["metrics"] == {}
    assert rows[2]["messages"][-1]["content"] == "lone \ufffd surrogate"


def test_parquet_of_fields_with_mixed_types_fails_on_one_line(trajectories: Path, tmp_path: Path) -> None:
    first, second, *_ = trajectories.read_text().splitlines()
    path = tmp_path / "mixed.jsonl"
    path.write_text(first + "\n" + json.dumps({**json.loads(second), "seed": [1]}) + "\n")  # TypeError before
    result = rl_llm("export", str(path), "--format", "parquet")
    assert result.returncode == 2 and "--format parquet cannot store these episodes" in result.stdout, \
        result.stdout + result.stderr  # fmt: skip
    assert "Traceback" not in result.stderr and not list(tmp_path.glob("*parquet*"))


@pytest.mark.parametrize(("fmt", "out"), [
    ("sft-jsonl", "eval.trajectories.jsonl"),  # the file read
    ("parquet", "eval.jsonl"),  # an episode log whose trajectories were read through its sibling
    ("hf", "."),  # the run directory read
])  # fmt: skip
def test_the_output_never_replaces_the_input(fmt: str, out: str, trajectories: Path, tmp_path: Path) -> None:
    log = tmp_path / "eval.jsonl"
    log.write_text('{"seed": 0, "episode_return": 1.0, "turns": 2}\n')
    before = {path: path.read_bytes() for path in (trajectories, log)}
    source = log if out == "eval.jsonl" else (tmp_path if out == "." else trajectories)
    result = rl_llm("export", str(source), "--format", fmt, "--out", str(tmp_path / out))
    assert result.returncode == 2 and "is what is being read; name another output" in result.stdout, \
        result.stdout + result.stderr  # fmt: skip
    assert {path: path.read_bytes() for path in before} == before  # overwritten by the export before


def test_outputs_that_are_no_plain_file_are_written_in_place_or_refused(trajectories: Path, tmp_path: Path) -> None:
    import os
    import stat

    result = rl_llm("export", str(trajectories), "--format", "hf", "--out", str(trajectories.with_suffix(".x")))
    assert result.returncode == 0, result.stdout + result.stderr
    taken = tmp_path / "taken.txt"
    taken.write_text("keep")
    result = rl_llm("export", str(trajectories), "--format", "hf", "--out", str(taken))
    assert result.returncode == 2 and "is a file; --format hf writes a directory" in result.stdout  # "File exists"
    result = rl_llm("export", str(trajectories), "--format", "sft-jsonl", "--out", str(taken / "x.jsonl"))
    assert result.returncode == 2 and f"cannot write {taken}/x.jsonl: {taken} is a file" in result.stdout
    try:  # a device like /dev/null: as root the atomic rename replaced the device node with a plain file
        os.mknod(tmp_path / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        return
    result = rl_llm("export", str(trajectories), "--format", "sft-jsonl", "--out", str(tmp_path / "null"))
    assert result.returncode == 0 and stat.S_ISCHR((tmp_path / "null").stat().st_mode), result.stdout
    assert taken.read_text() == "keep"


def write_earlier_export(trajectories: Path, out: Path) -> int:
    """An hf export at ``out`` (what a later one may replace); its number of rows."""
    return len(export(trajectories, "hf", out).rows)


def test_an_hf_export_that_fails_midway_leaves_no_partial_directory(trajectories: Path, tmp_path: Path) -> None:
    """save_to_disk wrote into --out itself: a write that failed midway (here a real one, the process's file
    size limit, as a full disk fails) left a directory with a cut shard and no state.json, which
    load_from_disk cannot read, or an earlier export there half replaced."""
    datasets = pytest.importorskip("datasets", reason="--format hf needs the datasets package (the export extra)")
    resource = pytest.importorskip("resource", reason="the file size limit (RLIMIT_FSIZE) is POSIX only")
    big = tmp_path / "big.trajectories.jsonl"  # about 1.3 MB of episodes: a shard past the 256 KiB limit
    big.write_text("".join(Trajectory(env_id="rl-llm/Toy-v0", task_id=f"t{seed}", seed=seed, turns=[Turn("a", "", 1.0)],
                                      messages=[Message("user", "x" * 20_000), Message("assistant", "a")]).to_json()
                           + "\n" for seed in range(64)))  # fmt: skip
    earlier = tmp_path / "earlier.hf"
    assert write_earlier_export(trajectories, earlier) == 5

    def limit_file_size() -> None:  # in the child: a write past 256 KiB fails with EFBIG (Python ignores SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))

    before = sorted(path.name for path in tmp_path.iterdir())
    for out in (tmp_path / "new.hf", earlier):
        result = subprocess.run([sys.executable, "-m", "rl_llm.cli", "export", str(big), "--format", "hf", "--out",
                                 str(out)], capture_output=True, text=True, timeout=300, preexec_fn=limit_file_size,
                                env=cli_env(COLUMNS="200", PYTHONDONTWRITEBYTECODE="1"))  # fmt: skip
        assert result.returncode == 2 and "File too large" in result.stdout, result.stdout + result.stderr
        assert "Traceback" not in result.stderr
        assert sorted(path.name for path in tmp_path.iterdir()) == before  # no new.hf, no temporary left
    assert len(datasets.load_from_disk(str(earlier))) == 5  # the earlier export, whole


def test_an_hf_export_replaces_an_earlier_one_and_nothing_else(trajectories: Path, tmp_path: Path) -> None:
    """Other formats replace their file; hf replaces an earlier export's directory whole (its old rows gone),
    but never a directory of other files, where save_to_disk wrote among (and over) them."""
    datasets = pytest.importorskip("datasets", reason="--format hf needs the datasets package (the export extra)")
    out = tmp_path / "x.hf"
    write_earlier_export(trajectories, out)
    assert len(export(trajectories, "hf", out, min_return=1.5).rows) == 1
    assert len(datasets.load_from_disk(str(out))) == 1
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "notes.md").write_text("mine")
    result = rl_llm("export", str(trajectories), "--format", "hf", "--out", str(folder))
    assert result.returncode == 2, result.stdout + result.stderr
    assert (f"error: --out {folder} is a directory that holds no saved dataset (state.json, dataset_info.json); "
            "--format hf replaces only an earlier export: name a new directory") in result.stdout  # fmt: skip
    assert [path.name for path in folder.iterdir()] == ["notes.md"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert len(datasets.load_from_disk(str(export(trajectories, "hf", empty).out))) == 5


def test_an_export_into_a_training_runs_folders_is_refused(trajectories: Path, tmp_path: Path) -> None:
    """A run's folders are the trainer's: an hf export named step_* under checkpoints/ was taken for the
    newest checkpoint (its state.json) and resumed from; model/ is rewritten at the end of a run. The run
    directory's top level, where the default output goes, stays open."""
    import yaml

    from rl_llm.trainers.config import TrainConfig, config_to_dict

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(config_to_dict(TrainConfig())))  # as the trainer saves it
    (run / "samples.jsonl").write_text(trajectories.read_text())
    for fmt, out in (("hf", run / "checkpoints" / "step_000099"), ("sft-jsonl", run / "model" / "data.jsonl")):
        result = rl_llm("export", str(run), "--format", fmt, "--out", str(out))
        assert result.returncode == 2, result.stdout + result.stderr
        folder = out.relative_to(run).parts[0]
        assert (f"error: --out {out} is inside {folder}/ of the training run {run.resolve()}, which the trainer "
                "manages; write the export at the run directory's top level or outside it") in result.stdout
        assert not out.exists()
    assert export(run, "sft-jsonl").out == run / "export.sft.jsonl"  # the default, at the top level
    assert len(export(run, "sft-jsonl", tmp_path / "elsewhere" / "x.jsonl").rows) == 5


@pytest.mark.parametrize(("content", "message"), [
    (b"\xff\xfe{}", r"sft.jsonl: not UTF-8 text \(invalid start byte at byte 0\)"),  # named no file
    (b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", r"sft.jsonl:1: not JSON \(nested too deeply\)"),
    (b'{"messages": [], "n": ' + b"9" * 5000 + b"}", r"sft.jsonl:1: not JSON \(Exceeds the limit"),
])  # fmt: skip
def test_an_sft_file_that_is_no_json_lines_is_named_with_its_line(content: bytes, message: str, tmp_path: Path) -> None:
    path = tmp_path / "sft.jsonl"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        read_sft_jsonl(path)
