"""A Harbor / Terminal-Bench task's metadata file with a repeated key is refused, naming the file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_llm.envs.terminal.harbor import load_harbor_task


def terminal_bench_task(root: Path, task_yaml: str) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "task.yaml").write_text(task_yaml)
    (root / "run-tests.sh").write_text("test -f /app/done.txt\n")
    (root / "tests" / "test_outputs.py").write_text("def test_x():\n    pass\n")
    return root


def test_a_repeated_key_in_task_yaml_is_refused(tmp_path: Path) -> None:
    """The last instruction won silently before: the task asked for something its author did not mean."""
    task = terminal_bench_task(tmp_path / "tb", "instruction: Create /app/done.txt.\ndifficulty: hard\n"
                                                "instruction: Delete everything.\n")  # fmt: skip
    with pytest.raises(ValueError) as refused:
        load_harbor_task(task)
    assert str(refused.value) == (f"{task / 'task.yaml'}: not valid YAML (line 3, column 1: duplicate key "
                                  "'instruction' (first on line 1))")  # fmt: skip


def test_a_repeated_key_in_task_toml_is_refused_with_the_file_named(tmp_path: Path) -> None:
    task = tmp_path / "harbor"
    (task / "tests").mkdir(parents=True)
    (task / "instruction.md").write_text("Create /app/done.txt.\n")
    (task / "tests" / "test.sh").write_text("test -f /app/done.txt\n")
    (task / "task.toml").write_text('[metadata]\ndifficulty = "easy"\ndifficulty = "hard"\n')
    with pytest.raises(ValueError, match=rf"^{task / 'task.toml'}: not valid TOML \(Cannot overwrite a value \(at line 3"):
        load_harbor_task(task)
