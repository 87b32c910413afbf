"""rl_llm.envs.tools: the tools of the tool-call environment (search, calculator, python) and their schemas."""

from rl_llm.envs.tools.calculator import CalculatorError, calculate, format_number
from rl_llm.envs.tools.python_tool import PythonTool, ToolUnavailable
from rl_llm.envs.tools.specs import TOOLS, ToolSpec, validate_arguments

__all__ = ["TOOLS", "CalculatorError", "PythonTool", "ToolSpec", "ToolUnavailable", "calculate", "format_number",
           "validate_arguments"]  # fmt: skip
