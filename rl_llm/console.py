"""The one way rl-llm makes a rich Console for output meant for people, and the parser its commands' help
comes from.

In a terminal rich wraps long lines at the terminal's width. Written to a pipe or a file it would break
them at 80 columns, splitting paths and error messages and defeating grep, so there messages are printed
unwrapped (soft wrap) and only tables are laid out to a width: COLUMNS, else 160 (their cells may wrap).
argparse's help has the same habit (80 columns in a pipe); ``ArgumentParser`` here wraps it only on a terminal.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

LOG_WIDTH = 160  # table width in pipes and logs when COLUMNS is not set


class PeopleConsole(Console):
    """A Console whose messages never hard-wrap outside a terminal; tables keep their layout. Decided at
    each print, so a console made at import time follows where stdout goes later (pytest's capture, a pipe)."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        if kwargs.get("soft_wrap") is None:
            # Tables are laid out to the width (soft wrap would also drop their title's centring).
            has_table = any(isinstance(item, Table) for item in objects)
            kwargs["soft_wrap"] = not has_table and not self.is_terminal
        super().print(*objects, **kwargs)


def make_console(*, stderr: bool = False, **kwargs: Any) -> Console:
    """A Console for messages and tables: soft wrap (no line breaks added) unless it writes to a terminal.
    Keyword arguments go to ``rich.console.Console``."""
    console = PeopleConsole(stderr=stderr, **kwargs)
    if "width" not in kwargs and not os.environ.get("COLUMNS") and not console.is_terminal and not console.is_jupyter:
        # rich would lay tables out in 80 columns and cut long cells (agent names, paths) with an ellipsis.
        console.width = LOG_WIDTH
    return console


class UnwrappedHelp(argparse.HelpFormatter):
    """argparse's help and usage, wrapped at the terminal's width on a terminal and nowhere else (a pipe, a
    log, ``--help | grep``), where argparse would break every line at 80 columns."""

    def __init__(self, prog: str, **kwargs: Any) -> None:
        kwargs.setdefault("width", shutil.get_terminal_size().columns - 2 if sys.stdout.isatty() else 1_000_000)
        super().__init__(prog, **kwargs)


class UnwrappedRawDescriptionHelp(UnwrappedHelp, argparse.RawDescriptionHelpFormatter):
    """``UnwrappedHelp`` that prints the description (a module docstring) as written."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with ``UnwrappedHelp`` unless told otherwise; its subcommands' parsers too (argparse
    makes them of the parent's class)."""

    def __init__(self, *args: Any, formatter_class: type[argparse.HelpFormatter] = UnwrappedHelp, **kwargs: Any) -> None:
        super().__init__(*args, formatter_class=formatter_class, **kwargs)
