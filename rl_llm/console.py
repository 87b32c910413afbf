"""The one way rl-llm makes a rich Console for output meant for people.

In a terminal rich wraps long lines at the terminal's width. Written to a pipe or a file it would break
them at 80 columns, splitting paths and error messages and defeating grep, so there messages are printed
unwrapped (soft wrap) and only tables are laid out to a width: COLUMNS, else 160 (their cells may wrap).
"""

from __future__ import annotations

import os
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
