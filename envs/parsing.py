"""Parsing of LLM turns: XML-style tags and OpenAI-style JSON tool calls.

Every function here runs in linear time in the length of the text (``str.find``, no backtracking regex
over the whole turn), so a megabyte of unclosed or nested tags cannot stall an environment step.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

# Unicode category Nd, the decimal digits of every script (what ``re``'s ``\d`` matches in a str pattern).
_DECIMAL_DIGIT = re.compile(r"\d")
# The full-width forms of ASCII (U+FF01..U+FF5E, NFKC's mapping), so "１，２３４．５" reads as "1,234.5".
_FULL_WIDTH = {code: code - 0xFEE0 for code in range(0xFF01, 0xFF5F)}
# Characters written for a minus sign, for ``str.translate`` to "-": with only U+2212 mapped, "\u20134" (an en
# dash) lost its sign and was graded as 4.
MINUS_SIGNS = str.maketrans(dict.fromkeys(
    "\u2010\u2011\u2012\u2013\u2014\u2015\u2212\u207b\u208b\ufe58\ufe63\uff0d", "-"
))  # fmt: skip


def ascii_digits(text: str) -> str:
    """``text`` with every decimal digit of any script (full-width ``４``, Arabic-Indic ``٤``) written as its
    ASCII digit, and full-width punctuation and letters as ASCII, so answers compare by the number they write.

    Deliberately not all of NFKC: superscripts (``²``), subscripts, fractions (``½``) and circled digits also
    have a digit as NFKC form, but they stay as they are, so ``4²`` (16) never reads as ``42``."""
    if text.isascii():
        return text
    return _DECIMAL_DIGIT.sub(lambda digit: str(unicodedata.decimal(digit[0])), text.translate(_FULL_WIDTH))


def extract_tag(text: str, tag: str, *, last: bool = False) -> str | None:
    """Content of the first (or last) complete ``<tag>...</tag>`` in ``text``, or None.

    Whitespace around the content is stripped. An opening tag without a closing tag does not count.
    """
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    if last:
        end = text.rfind(close_tag)
        if end < 0:
            return None
        start = text.rfind(open_tag, 0, end)
        if start < 0:
            return None
        return text[start + len(open_tag) : end].strip()
    start = text.find(open_tag)
    if start < 0:
        return None
    end = text.find(close_tag, start + len(open_tag))
    if end < 0:
        return None
    return text[start + len(open_tag) : end].strip()


def extract_all_tags(text: str, tag: str, *, limit: int | None = None) -> list[str]:
    """Contents of every complete ``<tag>...</tag>``, in order (at most ``limit`` of them)."""
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    found: list[str] = []
    position = 0
    while limit is None or len(found) < limit:
        start = text.find(open_tag, position)
        if start < 0:
            break
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            break
        found.append(text[start + len(open_tag) : end].strip())
        position = end + len(close_tag)
    return found


def first_of_tags(text: str, tags: tuple[str, ...]) -> tuple[str, str] | None:
    """The earliest complete tag among ``tags`` as ``(tag, content)``, or None.

    Used where a turn holds exactly one action of several kinds (``<search>`` or ``<answer>``).
    """
    best: tuple[int, str, str] | None = None
    for tag in tags:
        open_tag, close_tag = f"<{tag}>", f"</{tag}>"
        start = text.find(open_tag)
        if start < 0 or (best is not None and start > best[0]):
            continue
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            continue
        best = (start, tag, text[start + len(open_tag) : end].strip())
    return None if best is None else (best[1], best[2])


def truncate_middle(text: str, max_chars: int, note: str = "[... {n} characters truncated ...]") -> str:
    """Keep the head and tail of ``text`` within ``max_chars``, saying how much was cut."""
    if len(text) <= max_chars:
        return text
    cut = len(text) - max_chars
    half = max_chars // 2
    return text[:half] + "\n" + note.format(n=cut) + "\n" + text[len(text) - (max_chars - half) :]


@dataclass
class ToolCall:
    """One parsed tool call. ``error`` is set (and ``name``/``arguments`` may be partial) when malformed."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


_TOOL_CALL_TAG = "tool_call"
_JSON_OBJECT_START = re.compile(r"\{\s*\"name\"")


def parse_json_tool_calls(text: str, *, limit: int = 16) -> list[ToolCall]:
    """OpenAI/Hermes-style tool calls: ``<tool_call>{"name":..., "arguments":{...}}</tool_call>`` blocks,
    or bare JSON objects with a ``"name"`` key when no such block is present.

    Returns at most ``limit + 1`` calls, so a caller can tell "too many" from "exactly the limit".
    """
    blocks = extract_all_tags(text, _TOOL_CALL_TAG, limit=limit + 1)
    if not blocks:
        blocks = _bare_json_objects(text, limit + 1)
    return [_parse_tool_call_json(block) for block in blocks]


def _bare_json_objects(text: str, limit: int) -> list[str]:
    decoder = json.JSONDecoder()
    found: list[str] = []
    position = 0
    while len(found) < limit:
        match = _JSON_OBJECT_START.search(text, position)
        if match is None:
            break
        try:
            _, end = decoder.raw_decode(text, match.start())
        # ValueError: JSONDecodeError, or an integer past int's digit limit (sys.get_int_max_str_digits).
        except (ValueError, RecursionError):  # the parse below reports what is wrong
            found.append(text[match.start() :])
            break
        found.append(text[match.start() : end])
        position = end
    return found


def _parse_tool_call_json(block: str) -> ToolCall:
    # json raises RecursionError (not JSONDecodeError) on deeply nested arrays or objects, and a plain
    # ValueError on an integer literal past int's digit limit (4,300 by default, sys.get_int_max_str_digits).
    try:
        payload = json.loads(block)
    except json.JSONDecodeError as exc:
        return ToolCall(name="", error=f"tool call is not valid JSON ({exc.msg} at position {exc.pos})")
    except RecursionError:
        return ToolCall(name="", error="tool call is not valid JSON (nested too deeply)")
    except ValueError:
        return ToolCall(name="", error="tool call is not valid JSON (a number with too many digits)")
    if not isinstance(payload, dict):
        return ToolCall(name="", error="tool call must be a JSON object with 'name' and 'arguments'")
    # Accept the OpenAI wire form {"type": "function", "function": {...}} as well.
    if isinstance(payload.get("function"), dict):
        payload = payload["function"]
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(name="", error="tool call has no string 'name'")
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI sends arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return ToolCall(name=name, error=f"'arguments' is not valid JSON ({exc.msg})")
        except RecursionError:
            return ToolCall(name=name, error="'arguments' is not valid JSON (nested too deeply)")
        except ValueError:
            return ToolCall(name=name, error="'arguments' is not valid JSON (a number with too many digits)")
    if not isinstance(arguments, dict):
        return ToolCall(name=name, error="'arguments' must be a JSON object")
    return ToolCall(name=name, arguments=arguments)


@dataclass(frozen=True)
class Block:
    """One ``open ... close`` span found by ``scan_blocks``. ``closed`` is False for an opening marker whose
    closing marker never comes (then ``content`` runs to the end of the text)."""

    name: str
    content: str
    start: int
    end: int
    closed: bool = True


def scan_blocks(text: str, markers: dict[str, tuple[str, str]], *, limit: int | None = None) -> list[Block]:
    """Blocks of several kinds (``name -> (open, close)`` markers), in order of appearance.

    Text inside a block is not searched for other blocks (a ``<python>`` body may print ``"<answer>"``).
    Scanning stops at the first unclosed block, which is returned with ``closed=False``, or after ``limit``
    blocks. Each marker's next occurrence is only searched forward, so the scan is linear in ``len(text)``.
    """
    next_open = {name: text.find(opening) for name, (opening, _) in markers.items()}
    blocks: list[Block] = []
    position = 0
    while limit is None or len(blocks) < limit:
        for name, (opening, _) in markers.items():
            if 0 <= next_open[name] < position:
                next_open[name] = text.find(opening, position)
        live = [(found, name) for name, found in next_open.items() if found >= 0]
        if not live:
            break
        start, name = min(live)
        opening, closing = markers[name]
        end = text.find(closing, start + len(opening))
        if end < 0:
            blocks.append(Block(name, text[start + len(opening) :].strip(), start, len(text), closed=False))
            break
        blocks.append(Block(name, text[start + len(opening) : end].strip(), start, end + len(closing)))
        position = end + len(closing)
    return blocks
