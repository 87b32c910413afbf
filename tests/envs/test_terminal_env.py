"""``rl-llm/Terminal-v0`` in a real sandbox: protocol, limits, task sources and the baselines' scores."""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gymnasium as gym
import pytest

import rl_llm  # noqa: F401
from rl_llm.agents.baselines.terminal import DoNothing, RandomCommands, TerminalOracle
from rl_llm.agents.evaluate import evaluate
from rl_llm.envs.terminal import FAMILIES, TerminalTask, generate_task, load_task_folder
from rl_llm.envs.terminal.terminal_env import INVALID_ACTION, TerminalEnv, parse_turn
from rl_llm.sandboxes import SandboxPool, available_backends, make
from tests.envs.helpers_search import play
from tests.envs.test_terminal_tasks import BASH_TEST, PY_TEST, write_task

ISOLATING = [name for name in available_backends() if name != "local"]
pytestmark = pytest.mark.skipif(not ISOLATING, reason="no isolating sandbox backend (bwrap or docker) here")
ANSWER_TASK = TerminalTask(
    task_id="test/answer", family="custom", difficulty=1, description="Write 42 to answer.txt.",
    files={"notes/readme.txt": "hello\n"},
    checks=({"kind": "file_text", "path": "answer.txt", "expected": "42", "mode": "stripped"},),
    solution=("echo 42 > answer.txt",),
)


@pytest.fixture(scope="module")
def env() -> Iterable[TerminalEnv]:
    environment = TerminalEnv(command_timeout_s=5.0)
    yield environment
    environment.close()


AGENTS = {"oracle": TerminalOracle, "do_nothing": DoNothing, "random": RandomCommands}


def sweep(family: str, seeds: range, workers: int = 1, agents: tuple[str, ...] = tuple(AGENTS)) -> dict[str, list[float]]:
    """Returns of the baselines on ``seeds`` of ``family`` (one env per worker)."""

    def work(part: list[int]) -> dict[str, list[float]]:
        environment = TerminalEnv(task_family=family, command_timeout_s=10.0)
        try:
            return {name: [play(environment, AGENTS[name](seed=s), s)[0] for s in part] for name in agents}
        finally:
            environment.close()

    parts = [list(seeds)[i::workers] for i in range(workers)]
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(work, parts))
    return {name: [r for result in results for r in result[name]] for name in agents}


# -- the baselines --------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", list(FAMILIES))
def test_oracle_solves_and_baselines_fail_a_small_sweep(family: str) -> None:
    assert sweep(family, range(3), agents=("oracle",))["oracle"] == [1.0, 1.0, 1.0]
    returns = sweep(family, range(3, 5), agents=("do_nothing", "random"))
    assert returns == {"do_nothing": [0.0, 0.0], "random": [0.0, 0.0]}


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_oracle_solves_and_baselines_fail_500_seeds_per_family(family: str) -> None:
    returns = sweep(family, range(500), workers=max(1, min(4, (os.cpu_count() or 1))))
    assert sum(returns["oracle"]) == 500
    assert sum(returns["do_nothing"]) == 0
    assert sum(returns["random"]) <= 5  # "near 0": a lucky `echo 42 > answer.txt` may hit


def test_oracle_in_batches_sharing_a_sandbox_pool() -> None:
    with SandboxPool(size=2) as pool:
        trajectories = evaluate(lambda: TerminalEnv(sandbox=pool), TerminalOracle(), 4, seed=5, batch_size=2)
        assert [t.total_reward for t in trajectories] == [1.0] * 4
        assert pool.stats()["created"] <= 2


# -- protocol ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("turn", "expected"), [
    ("<command>ls</command>", ("ls", False)),
    ("<think>hmm</think><command>echo a</command> then <command>echo b</command>", ("echo b", False)),
    ("<command>ls</command><action>done</action>", ("ls", True)),
    ("<action>done</action><command>ls</command>", ("ls", True)),
    ("<action>DONE</action>", (None, True)),
    ("<command></command>", ("", False)), ("<command> </command><action>done</action>", (None, True)),
    ("<action>quit</action>", None), ("<command>ls", None), ("just text", None),
])
def test_parse_turn(turn: str, expected: tuple[str | None, bool] | None) -> None:
    assert parse_turn(turn) == expected


def test_observations_follow_the_endless_terminals_format(env: TerminalEnv) -> None:
    observation, info = env.reset(options={"task": ANSWER_TASK})
    assert observation == ANSWER_TASK.description and info["task_id"] == "test/answer"
    assert "<command>" in info["system_prompt"] and info["stop"] == ["</command>", "</action>"]
    observation, reward, terminated, truncated, info = env.step("<command>cat notes/readme.txt</command>")
    assert observation == "Command executed successfully. Output: hello\n\n\n(exit_code=0)"
    assert (reward, terminated, truncated, info["invalid_action"]) == (0.0, False, False, False)
    observation = env.step("<command>ls missing-dir</command>")[0]
    assert observation.startswith("Command failed. Output: ") and observation.endswith("(exit_code=2)")
    assert "No such file" in observation
    assert env.step("<command>cd notes && export X=5</command>")[0].endswith("(exit_code=0)")
    assert "5 /workspace/notes" in env.step("<command>echo $X $PWD</command>")[0]
    observation, reward, terminated, _, info = env.step("not an action")
    assert observation == INVALID_ACTION and info["invalid_action"] and reward == 0.0 and not terminated
    assert env.step("<command>   </command>")[2] is False
    observation, reward, terminated, truncated, info = env.step("<action>done</action>")
    assert (observation, reward, terminated, truncated) == ("", 0.0, True, False)
    assert info["check"]["passed"] is False and info["metrics"]["commands"] == 4.0
    assert "The completion check failed." in env.render()


def test_long_output_is_truncated_with_a_note() -> None:
    environment = TerminalEnv(max_output_chars=200)
    try:
        environment.reset(options={"task": ANSWER_TASK})
        observation = environment.step("<command>seq 1 5000</command>")[0]
        assert "characters of output truncated" in observation
        assert observation.startswith("Command executed successfully. Output: 1\n2\n3")
        assert "4999\n5000" in observation and len(observation) < 400
    finally:
        environment.close()


def test_a_timed_out_command_is_interrupted_and_the_shell_survives() -> None:
    environment = TerminalEnv(command_timeout_s=1.0)
    try:
        environment.reset(options={"task": ANSWER_TASK})
        observation, *_, info = environment.step("<command>export KEEP=1; sleep 20</command>")
        assert observation.endswith("(exit_code=124)") and "timed out after 1 seconds" in observation
        assert info["metrics"]["timeouts"] == 1.0
        assert "kept=1" in environment.step("<command>echo kept=$KEEP; echo 42 > answer.txt</command>")[0]
        assert environment.step("<action>done</action>")[1] == 1.0
    finally:
        environment.close()


def test_the_wall_clock_budget_ends_the_episode_without_a_check() -> None:
    environment = TerminalEnv(time_budget_s=1.0, command_timeout_s=30.0)
    try:
        environment.reset(options={"task": ANSWER_TASK})
        observation, reward, terminated, truncated, info = environment.step("<command>echo 42 > answer.txt; sleep 5</command>")
        assert (observation, reward, terminated, truncated) == ("", 0.0, True, False)
        assert info["time_budget_exceeded"] and not info["check"]["passed"]
        with pytest.raises(RuntimeError, match="call reset"):
            environment.step("<action>done</action>")
        assert environment.reset(options={"task": ANSWER_TASK})[0] == ANSWER_TASK.description
    finally:
        environment.close()


def test_the_last_turn_is_checked_and_truncates() -> None:
    environment = TerminalEnv(max_turns=3)
    try:
        environment.reset(options={"task": ANSWER_TASK})
        assert environment.step("<command>echo 42 > answer.txt</command>")[1:4] == (0.0, False, False)
        assert environment.step("thinking...")[1:4] == (0.0, False, False)
        observation, reward, terminated, truncated, info = environment.step("still thinking")
        assert (observation, reward, terminated, truncated) == ("", 1.0, False, True)
        assert info["invalid_action"] and info["check"]["passed"]
    finally:
        environment.close()


# -- tasks and options ----------------------------------------------------------------------------------------
def test_generated_task_set_indexes_like_the_generator(env: TerminalEnv) -> None:
    assert len(env.tasks) == 2**31 and env.tasks[12].task_id == generate_task(12).task_id
    assert env.reset(options={"task_index": 12})[1]["task_id"] == generate_task(12).task_id
    info = env.reset(seed=3, options={"task_family": "git", "difficulty": 2})[1]
    assert info["family"] == "git" and info["difficulty"] == 2 and info["task_id"].startswith("terminal/git/")
    assert env.reset(seed=3)[1]["task_id"] == env.reset(seed=3)[1]["task_id"] != env.reset(seed=4)[1]["task_id"]
    filtered = TerminalEnv(task_family=["sqlite"], difficulty=1)
    assert filtered.tasks[5].task_id == generate_task(5, ["sqlite"], 1).task_id
    with pytest.raises(ValueError, match="task_index"):
        env.reset(options={"task_index": -1})
    with pytest.raises(TypeError, match="TerminalTask or a task directory"):
        env.reset(options={"task": 42})
    # A path that names no task is the caller's bad input (ValueError: an env server answers 400 and keeps the
    # session), not an OSError (answered as an env crash: 500, session closed).
    with pytest.raises(ValueError, match=r"options\['task'\]: task directory .* does not exist"):
        env.reset(options={"task": "/nonexistent/task"})
    with pytest.raises(ValueError, match="has none of"):
        env.reset(options={"task": "/"})
    assert env.reset(options={"task_index": 12})[1]["task_id"] == generate_task(12).task_id  # still usable


def test_hand_written_task_folders(tmp_path: Path) -> None:
    write_task(tmp_path, "a_bash", "test.sh", BASH_TEST, solution="echo hello > greeting.txt\n")
    write_task(tmp_path, "b_python", "test_final_state.py", PY_TEST)
    environment = TerminalEnv(tasks=tmp_path)
    try:
        assert len(environment.tasks) == 2
        assert play(environment, TerminalOracle(), 0, {"task_index": 0})[0] == 1.0
        assert play(environment, DoNothing(), 0, {"task_index": 0})[0] == 0.0
        environment.reset(options={"task": tmp_path / "b_python"})
        assert "seed" in environment.step("<command>cat inbox/seed.txt</command>")[0]
        environment.step("<command>echo hello > greeting.txt</command>")
        assert environment.step("<action>done</action>")[1] == 1.0
        assert load_task_folder(tmp_path)[1] == TerminalEnv(tasks=tmp_path / "b_python").tasks[0]
        (tmp_path / "b_python" / "description.md").rename(tmp_path / "b_python" / "task.md")  # another name
        assert TerminalEnv(tasks=tmp_path / "b_python").tasks[0].description.startswith("Create greeting.txt")
    finally:
        environment.close()


def test_a_failing_setup_is_a_clear_error(tmp_path: Path) -> None:
    task = write_task(tmp_path, "broken", "test.sh", BASH_TEST)
    (task / "setup.sh").write_text("echo cannot-build >&2; exit 4\n")
    environment = TerminalEnv(tasks=tmp_path)
    try:
        with pytest.raises(RuntimeError, match=r"setup failed.*cannot-build"):
            environment.reset(seed=0)
        with pytest.raises(RuntimeError, match="call reset"):
            environment.step("<command>ls</command>")
        assert play(environment, TerminalOracle(), 0, {"task": ANSWER_TASK})[0] == 1.0
    finally:
        environment.close()


def test_a_given_sandbox_is_used_and_left_open() -> None:
    with make("auto") as sandbox:
        environment = TerminalEnv(sandbox=sandbox)
        assert play(environment, TerminalOracle(), 0, {"task": ANSWER_TASK})[0] == 1.0
        assert sandbox.read_file("answer.txt") == b"42\n"
        environment.close()
        assert not sandbox.closed


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"max_turns": 0}, ValueError), ({"time_budget_s": 0}, ValueError), ({"command_timeout_s": -1}, ValueError),
    ({"tasks": [1, 2]}, TypeError), ({"task_family": "nope"}, ValueError), ({"difficulty": 9}, ValueError),
])
def test_bad_arguments_are_refused(kwargs: dict, error: type[Exception]) -> None:
    with pytest.raises(error):
        TerminalEnv(**kwargs)


def test_registered_under_the_rl_llm_namespace() -> None:
    environment = gym.make("rl-llm/Terminal-v0", task_family="text", max_turns=4)
    try:
        assert environment.unwrapped.max_turns == 4
        assert environment.reset(seed=1)[1]["family"] == "text"
    finally:
        environment.close()
