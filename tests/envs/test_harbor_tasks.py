"""Harbor / Terminal-Bench task folders in ``rl-llm/Terminal-v0``: loading, and the shipped examples solved by
their oracle (the task's own solution) and failed by doing nothing, in a real sandbox."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest

from rl_llm.agents.baselines.terminal import DoNothing, TerminalOracle
from rl_llm.envs.terminal.harbor import EXAMPLES_DIR as EXAMPLES
from rl_llm.envs.terminal.harbor import is_harbor_task_dir, load_harbor_task, read_dockerfile, rewrite_workdir
from rl_llm.envs.terminal.task import load_task_folder
from rl_llm.sandboxes import available_backends
from tests.envs.helpers_search import play

ISOLATING = [name for name in available_backends() if name != "local"]
needs_sandbox = pytest.mark.skipif(
    not ISOLATING, reason="needs an isolating sandbox: bubblewrap (apt install bubblewrap) or docker"
)


def test_examples_load_as_terminal_tasks() -> None:
    tasks = load_task_folder(EXAMPLES)
    assert [task.variant for task in tasks] == ["count-errors", "region-totals"]
    count, totals = tasks
    assert count.difficulty == 1 and totals.difficulty == 2  # from task.toml [metadata] difficulty
    assert set(count.files) == {"server.log"} and set(totals.files) == {"data/sales.csv"}
    assert "/app" not in count.description and "./reports/error_count.txt" in count.description
    assert count.setup == "mkdir -p ./reports\n"  # the apt-get step is left out, the mkdir kept
    assert count.solution and "./server.log" in count.solution[0]
    # The verifier's files never reach the workspace: they travel inside the check.
    assert all(
        "test_outputs.py" not in name and "expected.csv" not in name for name in count.files | totals.files
    )
    assert count.checks[0]["kind"] == "bash_test" and "/tmp/rl-llm-harbor/tests" in count.checks[0]["source"]


def test_dockerfile_translation(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("print(1)\n")
    (tmp_path / "blob.bin").write_bytes(b"\x00\xff")
    (tmp_path / "Dockerfile").write_text(
        "FROM python:3.12\n# a comment\nWORKDIR /srv/app\nCOPY src/ ./src/\nCOPY blob.bin /srv/app/data/\n"
        "COPY blob.bin /usr/local/bin/tool\nRUN pip install numpy\nRUN echo hi > /srv/app/x.txt && \\\n    touch y\n"
    )  # fmt: skip
    workdir, files, setup = read_dockerfile(tmp_path / "Dockerfile", tmp_path)
    assert workdir == "/srv/app"
    assert files == {
        "src/a.py": "print(1)\n",
        "data/blob.bin": b"\x00\xff",
    }  # /usr/local/bin is not the workspace
    assert setup == "echo hi > ./x.txt &&      touch y\n"
    assert (
        rewrite_workdir("cd /srv/app; cat /srv/app/x /srv/apple /x/srv/app", "/srv/app")
        == "cd .; cat ./x /srv/apple /x/srv/app"
    )


def test_terminal_bench_layout_and_detection(tmp_path: Path) -> None:
    task = tmp_path / "tb-task"
    (task / "tests").mkdir(parents=True)
    (task / "task.yaml").write_text("instruction: |\n  Create /app/done.txt.\ndifficulty: hard\n")
    (task / "run-tests.sh").write_text("test -f /app/done.txt\n")
    (task / "solution.sh").write_text("touch /app/done.txt\n")
    (task / "tests" / "test_outputs.py").write_text("def test_x():\n    pass\n")
    assert is_harbor_task_dir(task) and not is_harbor_task_dir(tmp_path)
    loaded = load_harbor_task(task)
    assert loaded.description == "Create ./done.txt." and loaded.difficulty == 3
    assert loaded.solution == ("touch ./done.txt\n",)
    assert "TEST_DIR=" in loaded.checks[0]["source"] and "run-tests.sh" in loaded.checks[0]["source"]


@needs_sandbox
def test_oracle_passes_and_do_nothing_fails_every_example() -> None:
    env = gym.make("rl-llm/Terminal-v0", tasks=str(EXAMPLES), command_timeout_s=20.0)
    try:
        count = len(env.unwrapped.tasks)
        oracle = [play(env, TerminalOracle(), 0, {"task_index": i})[0] for i in range(count)]
        idle = [play(env, DoNothing(), 0, {"task_index": i})[0] for i in range(count)]
    finally:
        env.close()
    assert oracle == [1.0] * count
    assert idle == [0.0] * count


@needs_sandbox
def test_a_wrong_answer_fails(tmp_path: Path) -> None:
    env = gym.make("rl-llm/Terminal-v0", tasks=str(EXAMPLES / "count-errors"), command_timeout_s=20.0)
    try:
        env.reset(seed=0)
        # grep -c also counts the WARN line that mentions ERROR: a wrong answer.
        env.step("<command>grep -c ERROR server.log > reports/error_count.txt</command>")
        _, reward, terminated, _, _ = env.step("<action>done</action>")
    finally:
        env.close()
    assert terminated and reward == 0.0


def test_a_task_folder_with_a_symlink_out_of_it_is_refused(tmp_path: Path) -> None:
    """Task folders come from outside (datasets, git clones) and are read on the host: a link out of one copied
    a host file into the agent's workspace (a COPY'd folder) or into the check (a linked test or setup script)."""
    import shutil

    from rl_llm.envs.terminal.task import load_task_dir

    secret = tmp_path / "host-secret.txt"
    secret.write_text("TOPSECRET\n")
    harbor = tmp_path / "tasks" / "region-totals"
    shutil.copytree(EXAMPLES / "region-totals", harbor)
    (harbor / "environment" / "data" / "notes.txt").symlink_to(secret)
    hand = tmp_path / "tasks" / "hand"
    hand.mkdir()
    (hand / "description.md").write_text("Write ok to out.txt\n")
    (hand / "test.sh").write_text("grep -q ok out.txt\n")
    (hand / "setup.sh").symlink_to(secret)
    for folder, link in ((harbor, "environment/data/notes.txt"), (hand, "setup.sh")):
        with pytest.raises(ValueError, match=f"{link} is a symlink that leads outside the folder"):
            load_task_dir(folder)
    with pytest.raises(ValueError, match="leads outside"):  # the folder of tasks, and gym.make's tasks_dir
        load_task_folder(tmp_path / "tasks")
    # A link that stays inside the folder is fine.
    (harbor / "environment" / "data" / "notes.txt").unlink()
    (harbor / "environment" / "data" / "notes.txt").symlink_to(harbor / "environment" / "data" / "sales.csv")
    assert "TOPSECRET" not in str(load_harbor_task(harbor).files)
    assert load_harbor_task(harbor).files["data/notes.txt"] == load_harbor_task(harbor).files["data/sales.csv"]
