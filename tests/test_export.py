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
