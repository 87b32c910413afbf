"""Tool declarations (OpenAI function JSON schemas, shown to the agent) and argument validation that
explains exactly what is wrong with a call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list}
_TYPE_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array",
               type(None): "null"}  # fmt: skip


@dataclass(frozen=True)
class ToolSpec:
    """A tool with one required string argument (what the XML form ``<name>argument</name>`` carries)."""

    name: str
    description: str
    argument: str
    argument_description: str

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {self.argument: {"type": "string", "description": self.argument_description}},
                    "required": [self.argument],
                    "additionalProperties": False,
                },
            },
        }


def validate_arguments(spec: ToolSpec, arguments: Any) -> str | None:
    """None when ``arguments`` fit the spec's schema, else a message naming the problem."""
    parameters = spec.schema()["function"]["parameters"]
    if not isinstance(arguments, dict):
        return f"the arguments of '{spec.name}' must be a JSON object"
    for name in parameters["required"]:
        if name not in arguments:
            return f"'{spec.name}' needs the argument '{name}' ({parameters['properties'][name]['type']})"
    for name, value in arguments.items():
        if name not in parameters["properties"]:
            return f"'{spec.name}' has no argument '{name}'; its arguments are: {', '.join(parameters['properties'])}"
        expected = parameters["properties"][name]["type"]
        if not isinstance(value, _JSON_TYPES[expected]) or (expected != "boolean" and isinstance(value, bool)):
            got = _TYPE_NAMES.get(type(value), type(value).__name__)
            return f"the argument '{name}' of '{spec.name}' must be a {expected}, got {got}"
    return None


SEARCH = ToolSpec("search", "Search the knowledge base and return the top passages.", "query",
                  "keywords or a question, e.g. an entity name")  # fmt: skip
CALCULATOR = ToolSpec("calculator", "Evaluate an arithmetic expression: numbers, + - * / // % **, parentheses, "
                      "abs, round, min, max, sqrt, log, log10, exp, floor, ceil.", "expression",
                      "e.g. (2023 - 1954) * 2")  # fmt: skip
PYTHON = ToolSpec("python", "Run Python 3 code in an isolated sandbox (no network, a few seconds of time; each call "
                  "is a new process, so variables are not kept, but files it writes stay until the episode "
                  "ends); returns what the code prints.", "code",
                  "a complete program; print the result")  # fmt: skip
TOOLS = {spec.name: spec for spec in (SEARCH, CALCULATOR, PYTHON)}
