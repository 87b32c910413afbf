"""A safe arithmetic evaluator: the expression is parsed with ``ast`` and only numbers, arithmetic
operators and a few math functions are evaluated (never ``eval``). Sizes are bounded so that ``9**9**9``
or ``10**10**6`` fail fast with a message instead of hanging."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

from rl_llm.errors import RLLMError

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 1000
MAX_INT_DIGITS = 300
MAX_DEPTH = 250  # a sum of n terms nests n deep; 500 characters hold at most ~250 terms

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}  # fmt: skip
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _round(value: float, ndigits: int | None = None) -> float:
    # round(2, -10**8) computes 10**(10**8): bound the digits like every other integer here.
    if ndigits is not None and abs(ndigits) > MAX_INT_DIGITS:
        raise CalculatorError(f"round() keeps at most {MAX_INT_DIGITS} digits")
    return round(value, ndigits)


_FUNCTIONS: dict[str, Callable[..., float]] = {
    "abs": abs, "round": _round, "min": min, "max": max, "sqrt": math.sqrt, "log": math.log, "log10": math.log10,
    "exp": math.exp, "floor": math.floor, "ceil": math.ceil,
}  # fmt: skip
_CONSTANTS = {"pi": math.pi, "e": math.e}


class CalculatorError(RLLMError, ValueError):
    """An expression the calculator refuses, with a message meant for the agent."""


def calculate(expression: str) -> int | float:
    """Value of an arithmetic expression such as ``(1954 - 1890) * 2`` or ``sqrt(2) / 3``."""
    if not isinstance(expression, str):
        raise CalculatorError("the expression must be a string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression is over {MAX_EXPRESSION_CHARS} characters")
    if not expression.strip():
        raise CalculatorError("the expression is empty")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as exc:  # ValueError: NUL bytes
        raise CalculatorError(f"not a valid arithmetic expression ({getattr(exc, 'msg', exc)})") from None
    try:
        return _evaluate(tree.body, 0)
    except CalculatorError:
        raise
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("the result is too large") from None
    except (TypeError, ValueError) as exc:
        raise CalculatorError(f"invalid operation: {exc}") from None


def _evaluate(node: ast.expr, depth: int) -> int | float:
    if depth > MAX_DEPTH:
        raise CalculatorError("the expression is nested too deeply")
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return _check_size(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left, depth + 1), _evaluate(node.right, depth + 1)
        if isinstance(node.op, ast.Pow):
            if abs(right) > MAX_EXPONENT:
                raise CalculatorError(f"exponents are limited to {MAX_EXPONENT} in absolute value")
            if abs(left) > 1 and right > 0 and right * math.log10(abs(left)) > MAX_INT_DIGITS + 1:
                raise CalculatorError(f"results are limited to {MAX_INT_DIGITS} digits")  # refused before computing
        return _check_size(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        raise CalculatorError("'^' is not a power here: write a ** b")
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand, depth + 1))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
        if node.keywords or not node.args or len(node.args) > 8:
            raise CalculatorError(f"{node.func.id}() takes 1 to 8 positional numbers")
        return _check_size(_FUNCTIONS[node.func.id](*(_evaluate(arg, depth + 1) for arg in node.args)))
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.Tuple):
        raise CalculatorError("commas are not allowed: write numbers without thousands separators")
    allowed = ", ".join(sorted(_FUNCTIONS))
    raise CalculatorError(f"only numbers, + - * / // % **, parentheses and {allowed} are allowed")


def _check_size(value: int | float) -> int | float:
    if isinstance(value, complex):
        raise CalculatorError("the result is not a real number")
    if isinstance(value, int) and abs(value) >= 10**MAX_INT_DIGITS:
        raise CalculatorError(f"integers are limited to {MAX_INT_DIGITS} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is not a finite number")
    return value


def format_number(value: int | float) -> str:
    """Integers as digits; integral floats without ``.0``; others with up to 12 significant digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value) if isinstance(value, int) else f"{value:.12g}"
