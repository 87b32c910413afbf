"""Procedurally generated shell tasks with completion checks, for ``rl-llm/Terminal-v0``.

``generate_task(seed, family, difficulty)`` draws a task from ten families in ``families/`` (files, logs, data,
text, scripting, permissions, archives, config, git, sqlite); ``load_task_dir``/``load_task_folder`` read
hand-written tasks. ``workspace_checker.py`` is the program that sets up and checks a workspace inside the sandbox.
"""

from rl_llm.envs.terminal.generator import DIFFICULTIES, FAMILIES, generate_task
from rl_llm.envs.terminal.task import TerminalTask, is_task_dir, load_task_dir, load_task_folder

__all__ = ["DIFFICULTIES", "FAMILIES", "TerminalTask", "generate_task", "is_task_dir", "load_task_dir", "load_task_folder"]
