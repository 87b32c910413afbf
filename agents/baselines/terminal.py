"""Terminal baselines: the oracle (replays each task's ground-truth commands), do-nothing and random commands.

All three answer through the env's real action interface (``<command>``/``<action>done</action>``), so the
oracle proves every task solvable and the other two show that no task passes without the work.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rl_llm.agents.baselines.search import ScriptedOracle
from rl_llm.agents.policy import TextPolicy
from rl_llm.checks import real
from rl_llm.types import Message

DONE = "<action>done</action>"


def command_turn(command: str) -> str:
    return f"<command>{command}</command>"


class TerminalOracle(ScriptedOracle):
    """Runs the task's solution commands one per turn, then says done."""

    name = "oracle"

    def plan(self, env: Any) -> list[str]:
        task, limit = env.current_task, env.max_turns - 1
        if len(task.solution) > limit:
            raise ValueError(f"task {task.task_id} needs {len(task.solution)} commands, more than {limit} turns allow")
        return [command_turn(command) for command in task.solution] + [DONE]


class DoNothing(TextPolicy):
    """Declares the task done at once: scores 0 on every task whose initial state fails its check."""

    name = "do_nothing"

    def __init__(self, seed: int | None = None) -> None:
        pass

    def respond(self, conversation: list[Message]) -> str:
        return DONE


# Plausible but aimless shell activity: reading, listing, creating and deleting things by guesswork.
RANDOM_COMMANDS = (
    "ls -la", "pwd", "find . -maxdepth 2 | head -n 20", "cat *.txt | head -n 5", "echo hello > output.txt",
    "echo 42 > answer.txt", "touch result.txt", "mkdir -p out && cp -r . out/ 2>/dev/null; ls out | head",
    "rm -f *.log", "chmod -R 777 .", "sort -o sorted.txt *.txt", "wc -l * | tail -n 1", "date > date.txt",
    "git status", "tar -czf backup.tar.gz . 2>/dev/null; echo $?", "du -sh .", "head -c 100 /dev/urandom | base64",
    "grep -ri error . | head", "printf 'a,b\\n1,2\\n' > data.csv", "mv *.csv /tmp/ 2>/dev/null; ls",
    "echo '{}' > output.json", "uname -a", "env | sort | head", "ls -R | head -n 30", "rm -rf ./*/",
)


class RandomCommands(TextPolicy):
    """A random command from ``RANDOM_COMMANDS`` each turn, saying done with probability ``p_done``."""

    name = "random"

    def __init__(self, seed: int | None = None, p_done: float = 0.1) -> None:
        self.rng = np.random.default_rng(seed)
        self.p_done = real("p_done", p_done, minimum=0.0, maximum=1.0)  # a probability

    def respond(self, conversation: list[Message]) -> str:
        if self.rng.random() < self.p_done:
            return DONE
        return command_turn(RANDOM_COMMANDS[int(self.rng.integers(len(RANDOM_COMMANDS)))])
