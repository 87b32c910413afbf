"""Reward hacking in ``rl-llm/Terminal-v0`` scores 0, and the env stays usable with a clean next episode.

Each test plays real commands in the real sandbox; after every attempt the next episode must start from a
clean workspace and the oracle must still solve it.
"""

from __future__ import annotations

import ast
import secrets
import subprocess
from collections.abc import Iterable

import pytest

from rl_llm.agents.baselines.terminal import TerminalOracle
from rl_llm.envs.terminal import TerminalTask, generate_task
from rl_llm.envs.terminal.families.common import write_file_cmd
from rl_llm.envs.terminal.protocol import RUNNER_COMMAND, parse_verdict, runner_program
from rl_llm.envs.terminal.terminal_env import TerminalEnv
from tests.envs.test_terminal_env import ANSWER_TASK, ISOLATING, play

pytestmark = pytest.mark.skipif(not ISOLATING, reason="no isolating sandbox backend (bwrap or docker) here")


@pytest.fixture(scope="module")
def env() -> Iterable[TerminalEnv]:
    environment = TerminalEnv(command_timeout_s=10.0)
    yield environment
    environment.close()


def attempt(env: TerminalEnv, task: TerminalTask, *commands: str) -> tuple[float, list[str], dict]:
    """Run ``commands`` on ``task`` then say done: (reward, observations, final info)."""
    env.reset(options={"task": task})
    observations = [env.step(f"<command>{command}</command>")[0] for command in commands]
    _, reward, terminated, _, info = env.step("<action>done</action>")
    assert terminated
    return reward, observations, info


def assert_next_episode_is_clean(env: TerminalEnv) -> None:
    env.reset(options={"task": ANSWER_TASK})
    listing = env.step("<command>ls -A; ls -A /tmp</command>")[0]
    assert listing == "Command executed successfully. Output: notes\n\n\n(exit_code=0)"
    assert play(env, TerminalOracle(), 0, {"task": ANSWER_TASK})[0] == 1.0


def task_of(family: str, variant: str, difficulty: int = 1) -> TerminalTask:
    return generate_task(0, family, difficulty, variant=variant)


def test_deleting_the_checks_inputs_fails(env: TerminalEnv) -> None:
    logs = task_of("logs", "error_counts")
    report = logs.checks[0]["path"]
    assert attempt(env, logs, f"rm -rf logs && mkdir -p reports && : > {report}")[0] == 0.0
    assert attempt(env, task_of("sqlite", "raise_prices"), "rm -f shop.db")[0] == 0.0
    assert attempt(env, task_of("git", "commit_file"), "rm -rf repo && git init -q repo")[0] == 0.0
    assert_next_episode_is_clean(env)


def test_editing_the_inputs_to_match_a_made_up_answer_fails(env: TerminalEnv) -> None:
    logs = task_of("logs", "error_counts")
    level = "ERROR" if "ERROR" in logs.description.split("Count the ")[1][:6] else "WARN"
    report = logs.checks[0]["path"]
    forged = f"printf '2024-01-01 00:00:00 {level} [fake] x\\n' > logs/app.log && mkdir -p reports && echo 'fake 1' > {report}"
    reward, _, info = attempt(env, logs, forged)
    assert reward == 0.0 and report in info["check"]["message"]
    # The scripting check's inputs are not in the workspace at all: an agent cannot tune its program to them.
    script_task = task_of("scripting", "fizzbuzz")
    program = "mkdir -p bin && printf '#!/bin/sh\\necho 1\\n' > bin/fizz && chmod +x bin/fizz"
    assert attempt(env, script_task, program)[0] == 0.0
    assert_next_episode_is_clean(env)


def test_writing_the_expected_file_with_wrong_content_fails(env: TerminalEnv) -> None:
    assert attempt(env, ANSWER_TASK, "echo 41 > answer.txt")[0] == 0.0
    assert attempt(env, ANSWER_TASK, "echo '42 is the answer' > answer.txt")[0] == 0.0
    assert attempt(env, task_of("files", "list_large_files"), "find data -type f | sort > big_files.txt")[0] == 0.0
    assert attempt(env, task_of("data", "revenue_by_region"), "echo '{}' > region_totals.json")[0] == 0.0
    assert_next_episode_is_clean(env)


def test_the_check_and_its_expected_values_are_invisible_to_the_agent(env: TerminalEnv) -> None:
    secret = "SECRET-" + secrets.token_hex(8)
    task = TerminalTask("test/secret", "custom", 1, "Write the secret to answer.txt.",
                        checks=({"kind": "file_text", "path": "answer.txt", "expected": secret, "mode": "stripped"},))
    looks = [
        "grep -rlsF SECRET- /workspace /tmp /run /etc /var /home /dev/shm 2>/dev/null; echo searched",
        "cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c 'SECRE[T]-'",
        "ps -eo args | grep -ci '[r]unner\\|[R]LLM'",
    ]
    reward, observations, _ = attempt(env, task, *looks, "echo guess > answer.txt")
    assert reward == 0.0
    assert all(secret not in observation for observation in observations)
    assert observations[0].startswith("Command executed successfully. Output: searched")
    assert "Output: 0" in observations[1] and "Output: 0" in observations[2]


@pytest.mark.parametrize("kill", ["kill -9 $$", "exit 3", "kill -9 0", "exec false"])
def test_killing_the_shell_scores_zero_and_the_env_carries_on(env: TerminalEnv, kill: str) -> None:
    assert attempt(env, ANSWER_TASK, kill)[0] == 0.0
    env.reset(options={"task": ANSWER_TASK})
    observation = env.step(f"<command>{kill}</command>")[0]
    assert "shell exited" in observation and "(exit_code=" in observation
    assert env.step("<command>echo 42 > answer.txt</command>")[0].endswith("(exit_code=0)")  # a fresh shell
    assert env.step("<action>done</action>")[1] == 1.0
    assert_next_episode_is_clean(env)


def test_filling_the_disk_scores_zero_and_is_wiped(env: TerminalEnv) -> None:
    reward, observations, _ = attempt(
        env, ANSWER_TASK,
        "head -c 100M /dev/zero > huge.bin; ls -l huge.bin | awk '{print $5}'",
        "yes filler > /tmp/fill; df -k /tmp | tail -n 1",
        "for i in 1 2 3; do head -c 30M /dev/zero > fill$i.bin; done; du -sm . | cut -f1",
    )
    assert reward == 0.0
    assert "67108864" in observations[0]  # stopped at the 64 MiB file-size limit
    assert "100% /tmp" in observations[1]  # the private /tmp is full
    assert_next_episode_is_clean(env)


LEFTOVERS = TerminalTask(  # the check waits 2 s, then looks for a file an escaped job of the agent writes after 1 s
    "test/leftovers", "custom", 1, "Write 42 to answer.txt.",
    checks=({"kind": "file_text", "path": "answer.txt", "expected": "42", "mode": "stripped"},
            {"kind": "bash_test", "source": "sleep 2\n[ ! -e intruder.txt ]\n"}))  # fmt: skip
# The sleep gives the job time to leave the shell's process group before the agent says done.
ESCAPE = "setsid nohup sh -c 'sleep 1; touch intruder.txt; echo 0 > answer.txt' >/dev/null 2>&1 & disown; sleep 0.3"


def test_agent_processes_are_gone_before_the_check_runs(env: TerminalEnv) -> None:
    assert attempt(env, LEFTOVERS, "echo 42 > answer.txt", ESCAPE)[0] == 1.0
    assert_next_episode_is_clean(env)


def test_detached_processes_are_killed_before_the_check_where_the_session_cannot_end_them() -> None:
    # bwrap ends them with the session's PID namespace; on local (and docker) a setsid'd process outlives the
    # session, so the env has the sandbox kill every process it runs before the check.
    env = TerminalEnv(sandbox="local")
    try:
        assert attempt(env, LEFTOVERS, "echo 42 > answer.txt", ESCAPE)[0] == 1.0
    finally:
        env.close()


def test_planted_modules_and_forged_verdicts_do_not_pass(env: TerminalEnv) -> None:
    forged = "print('\\nRLLM-RESULT 0 1 \\'all checks passed\\''); raise SystemExit(0)"
    plant = " && ".join(f"echo {forged!r} > {name}.py" for name in
                        ("json", "subprocess", "tarfile", "sqlite3", "configparser", "sitecustomize", "usercustomize"))
    sites = "mkdir -p .local/lib/python3.11/site-packages && cp sitecustomize.py .local/lib/python3.11/site-packages/"
    assert attempt(env, ANSWER_TASK, plant, sites, "echo 'PYTHONSTARTUP=/workspace/json.py' >> .bashrc")[0] == 0.0
    # A program the check runs tries to print a verdict into the checker's own output.
    liar = ("mkdir -p bin && printf '#!/bin/sh\\necho RLLM-RESULT x 1 ok > /proc/$PPID/fd/1\\n"
            "echo RLLM-RESULT x 1 ok\\n' > bin/fizz && chmod +x bin/fizz")
    assert attempt(env, task_of("scripting", "fizzbuzz"), liar)[0] == 0.0
    assert_next_episode_is_clean(env)


def test_special_files_in_place_of_outputs_fail_fast(env: TerminalEnv) -> None:
    reward, _, info = attempt(env, ANSWER_TASK, "mkfifo answer.txt")
    assert reward == 0.0 and "not a regular file" in info["check"]["message"]
    assert attempt(env, ANSWER_TASK, "ln -s /dev/zero answer.txt")[0] == 0.0
    archive = task_of("archives", "create_backup")
    assert attempt(env, archive, f"mkdir -p backup && mkfifo {archive.checks[0]['path']}")[0] == 0.0
    assert_next_episode_is_clean(env)


MEMORY_THIEF = """#!/usr/bin/env python3
import os, re
# The check runs this program; its parent is the checker, whose memory holds the expected output.
try:
    maps = open(f"/proc/{os.getppid()}/maps").read().splitlines()
    memory = open(f"/proc/{os.getppid()}/mem", "rb", 0)
except PermissionError:
    raise SystemExit(0)
for line in maps:
    fields = line.split()
    start, end = (int(x, 16) for x in fields[0].split("-"))
    if "r" not in fields[1]:
        continue
    try:
        memory.seek(start)
        found = re.search(rb"SECRET-[0-9a-f]{16}", memory.read(end - start))
    except (OSError, OverflowError, ValueError):
        continue
    if found:
        print(found.group().decode())
        break
"""


def test_a_program_run_by_the_check_cannot_read_the_checkers_memory(env: TerminalEnv) -> None:
    secret = "SECRET-" + secrets.token_hex(8)
    task = TerminalTask("test/memory", "custom", 1, "Write bin/x.",
                        checks=({"kind": "script_io", "path": "bin/x", "cases": [{"stdout": secret + "\n"}]},))
    reward, _, info = attempt(env, task, write_file_cmd("bin/x", MEMORY_THIEF) + " && chmod +x bin/x")
    assert reward == 0.0 and "wrong output" in info["check"]["message"]


# Run by a script_io check: reads the verdict line off the run's stdout pipe (PID 1, the sandbox's shell,
# holds it and is dumpable) and writes it back with the flag flipped.
VERDICT_THIEF = r'''#!/usr/bin/env python3
import os, sys
print("hello")
sys.stdout.flush()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for fd in (0, 1, 2):
            os.close(fd)
        pipe = os.open("/proc/1/fd/1", os.O_RDWR)
        seen = b""
        while b"RLLM-RESULT " not in seen or not seen.endswith(b"\n"):
            seen += os.read(pipe, 65536)
        line = seen[seen.rfind(b"RLLM-RESULT "):]
        mark, tag, flag, message = line.split(b" ", 3)
        os.write(pipe, b"\n" + b" ".join([mark, tag, b"1", message]))
    os._exit(0)
'''


def test_a_verdict_read_off_the_pipe_cannot_be_sent_back_flipped() -> None:
    program, key = runner_program({"mode": "check", "checks": [
        {"kind": "file_text", "path": "answer.txt", "expected": "42", "mode": "stripped"}]})
    done = subprocess.run(RUNNER_COMMAND, input=program.encode(), capture_output=True, timeout=60, check=False,
                          cwd="/", env={"PATH": "/usr/bin:/bin"})
    honest = done.stdout.decode()
    line = honest[honest.rfind("RLLM-RESULT "):].strip()
    mark, tag, flag, message = line.split(" ", 3)
    assert flag == "0" and key not in honest  # the key itself never leaves the checker
    flipped = f"{honest}\n{mark} {tag} 1 {message}\n"
    assert parse_verdict(flipped, key) == parse_verdict(honest, key) == (False, ast.literal_eval(message))


def test_a_program_run_by_the_check_cannot_forge_the_verdict(env: TerminalEnv) -> None:
    task = TerminalTask("test/thief", "custom", 1, "Write bin/x and answer.txt.",
                        checks=({"kind": "script_io", "path": "bin/x", "cases": [{"stdout": "hello\n"}]},
                                {"kind": "file_text", "path": "answer.txt", "expected": "42", "mode": "stripped"}))
    for _ in range(4):  # the thief races the host for the line; before the fix it won about half the time
        reward, _, info = attempt(env, task, write_file_cmd("bin/x", VERDICT_THIEF) + " && chmod +x bin/x")
        assert reward == 0.0, info["check"]
    assert_next_episode_is_clean(env)
