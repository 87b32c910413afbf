"""Terminal-v0 (issue 16): a turn with a command and ``done`` runs the command, and whatever an agent does to
its workspace, the next episode's reset on the bwrap backend gives a clean, working one."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterable

import pytest

from rl_llm.envs.terminal.terminal_env import TerminalEnv
from rl_llm.sandboxes import available_backends, make
from tests.envs.test_terminal_env import ANSWER_TASK
from tests.envs.test_terminal_hacking import assert_next_episode_is_clean

NEEDS_BWRAP = pytest.mark.skipif(
    "bwrap" not in available_backends(), reason="needs bubblewrap: apt-get install bubblewrap (and user namespaces)"
)
pytestmark = NEEDS_BWRAP
NESTED = " && ".join(['mkdir -p $(printf "x/%.0s" {1..1500})', 'cd $(printf "x/%.0s" {1..1500})',
                      'mkdir -p $(printf "y/%.0s" {1..1500})', "cd ~"])  # fmt: skip
ATTACKS = {
    "chmod -R 000": "chmod -R 000 .",
    "unreadable subdirectories": "mkdir -p a/b/c && touch a/b/c/f && chmod 000 a/b/c a/b a && chmod 000 notes",
    "setuid, setgid and sticky bits": "chmod 7777 . notes && chmod 6755 notes/readme.txt",
    "fifos, sockets and symlinks out": (
        "mkfifo fifo && python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"sock\")' && "
        "ln -s / root && ln -s /etc/passwd passwd && ln -s . loop"
    ),
    "deleting or replacing the workspace": "cd / && rm -rf /workspace; mv /workspace /w2; mkdir /workspace; cd ~",
    "3000 nested directories": NESTED,
    "everything at once": f"{NESTED} && mkfifo fifo && chmod -R 000 .",
}


@pytest.fixture(scope="module")
def env() -> Iterable[TerminalEnv]:
    environment = TerminalEnv(sandbox="bwrap", command_timeout_s=60.0)
    yield environment
    environment.close()


def test_a_turn_with_a_command_and_done_runs_the_command_then_finishes(env: TerminalEnv) -> None:
    env.reset(options={"task": ANSWER_TASK})
    observation, reward, terminated, truncated, info = env.step(
        "<think>write it and stop</think><command>echo 42 > answer.txt</command><action>done</action>"
    )
    assert terminated and not truncated and reward == 1.0, observation
    assert info["metrics"]["commands"] == 1.0 and info["check"]["passed"]
    env.reset(options={"task": ANSWER_TASK})
    _, reward, terminated, *_ = env.step("<action>done</action><command>echo 41 > answer.txt</command>")
    assert terminated and reward == 0.0  # the command ran (wrong answer), then the check


@pytest.mark.parametrize("attack", list(ATTACKS.values()), ids=list(ATTACKS))
def test_the_next_reset_restores_a_working_workspace(env: TerminalEnv, attack: str) -> None:
    env.reset(options={"task": ANSWER_TASK})
    env.step(f"<command>{attack}</command>")
    _, reward, terminated, *_ = env.step("<action>done</action>")
    assert terminated and reward == 0.0
    # The spare shell warmed up after the episode starts in the workspace as the agent left it; letting it
    # start before the next reset makes the old failure (a dead spare kept across the wipe) deterministic.
    spare = getattr(getattr(env._owned, "_res", None), "spare", None)  # a Future of the spare shell
    if spare is not None:
        spare.exception()
        time.sleep(0.5)
    assert_next_episode_is_clean(env)


@pytest.mark.skipif(shutil.which("chattr") is None, reason="needs chattr (e2fsprogs) to set file flags")
def test_reset_removes_immutable_and_append_only_files() -> None:
    """The bwrap agent cannot set these flags (no CAP_LINUX_IMMUTABLE), but a reset must not depend on it."""
    with make("bwrap") as sandbox:
        if sandbox.run("id -u").exit_code != 0:
            pytest.skip("the bwrap sandbox cannot run commands here")
        sandbox.write_file("locked/immutable.txt", "x")
        sandbox.write_file("locked/append.txt", "x")
        flagged = [subprocess.run(["chattr", flag, str(sandbox.workdir / "locked" / name)], capture_output=True)
                   for flag, name in (("+i", "immutable.txt"), ("+a", "append.txt"))]  # fmt: skip
        if any(result.returncode != 0 for result in flagged):
            pytest.skip("needs root on a file system with inode flags (chattr +i failed)")
        subprocess.run(["chattr", "+i", str(sandbox.workdir / "locked")], check=True)
        try:
            sandbox.reset()
            assert list(sandbox.workdir.iterdir()) == []
            assert sandbox.run("touch ok && ls").stdout == "ok\n"
        finally:  # never leave an undeletable file in the shared sandbox directory
            locked = sandbox.workdir / "locked"
            if locked.exists():
                subprocess.run(["chattr", "-R", "-i", "-a", str(locked)], capture_output=True)


def test_an_agent_filling_its_workspace_is_stopped_can_go_on_and_leaves_a_clean_next_episode() -> None:
    """The workspace quota: a command and a background job that write past it are stopped, and the observation
    says why; the agent deletes files and solves the task; the next episode starts clean."""
    env = TerminalEnv(sandbox="bwrap", sandbox_kwargs={"workspace_size_mb": 8})
    writer = "for i in $(seq 1 50); do head -c 4M /dev/zero > {name}$i; sleep 0.05; done"
    try:
        env.reset(options={"task": ANSWER_TASK})
        observation = env.step(f"<command>{writer.format(name='f')}</command>")[0]
        assert observation.startswith("Command failed.") and observation.endswith("(exit_code=153)")
        assert "the workspace passed its size quota" in observation
        background = "rm f*; nohup sh -c '" + writer.format(name="bg") + "' >/dev/null 2>&1 &"
        assert env.step(f"<command>{background}</command>")[0].startswith("Command executed successfully.")
        time.sleep(1.5)  # the agent thinks; the job writes until the quota stops it
        observation = env.step("<command>rm -f bg*; echo 42 > answer.txt</command>")[0]
        assert "while no command was running" in observation and observation.endswith("(exit_code=0)")
        _, reward, terminated, *_ = env.step("<action>done</action>")
        assert terminated and reward == 1.0
        assert_next_episode_is_clean(env)
    finally:
        env.close()
