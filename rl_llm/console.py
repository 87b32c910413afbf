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
import socket
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from rich.console import Console
from rich.table import Table

from rl_llm.checks import integer, real, seconds

LOG_WIDTH = 160  # table width in pipes and logs when COLUMNS is not set
T = TypeVar("T")


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


# -- settings an operator gives, on a Python argument (ValueError naming it) or as an argparse type (``error:
# argument --flag: ...``), with rl_llm/checks.py's checks and words. Unchecked, a NaN timeout timed every call
# out at once, a 0 limit refused every request and a port past 65535 was bound modulo 65536 or failed deep in
# the server with a traceback.
def checked_port(name: str, value: Any) -> int:
    """A TCP port: 0 (any free one) to 65535."""
    return integer(name, value, minimum=0, maximum=65535)


def checked_host(name: str, value: Any) -> str:
    """An address this machine can bind. An empty one would bind every interface where loopback was meant."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a host name or IP address (0.0.0.0 for every interface), got {value!r}")
    try:
        socket.getaddrinfo(value, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as error:
        reason = getattr(error, "strerror", None) or error
        raise ValueError(f"{name} {value!r} is not a host name or IP address here: {reason}") from None
    return value


def flag_type(check: Callable[[str, Any], T], parse: Callable[[str], Any] = float) -> Callable[[str], T]:
    """An argparse ``type=`` running ``check`` on the parsed text: a bad value exits 2 with ``error: argument
    --flag: must be ...``."""

    def parsed(text: str) -> T:
        try:
            value = parse(text)
        except ValueError:
            kind = "an integer" if parse is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
        try:
            return check("", value)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error).strip()) from None

    return parsed


def count_flag(minimum: int = 1, maximum: int | None = None) -> Callable[[str], int]:
    return flag_type(lambda name, value: integer(name, value, minimum=minimum, maximum=maximum), int)


def seconds_flag(*, allow_zero: bool = False) -> Callable[[str], float]:
    return flag_type(lambda name, value: seconds(name, value, allow_zero=allow_zero))


def real_flag(*, minimum: float | None = None) -> Callable[[str], float]:
    """A finite number (at least ``minimum``): NaN and infinity are refused, as for every number rl-llm takes."""
    return flag_type(lambda name, value: real(name, value, minimum=minimum))


port_flag = flag_type(checked_port, int)
host_flag = flag_type(checked_host, str)
