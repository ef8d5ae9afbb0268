"""A safe calculator tool: arithmetic parsed with ``ast`` and evaluated node by node (never ``eval``).

Only numbers, ``+ - * / // % **``, unary signs and parentheses are accepted. Every bound is checked before the
work it limits: the expression's length and node count, each number's and each intermediate result's
magnitude, and a power's exponent and result size (so ``9**9**9`` is refused, not computed). Anything else
(names, calls, attributes, strings, comparisons) is an error message to the model.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from workers.tools.base import BaseTool, ToolResponse

MAX_CHARS = 200
MAX_NODES = 100
MAX_MAGNITUDE = 1e15  # numbers and every intermediate result
MAX_EXPONENT = 64

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_HINTS = {ast.BitXor: "use ** for powers", ast.MatMult: "use * to multiply"}


class CalculatorError(ValueError):
    """The expression is not allowed arithmetic or breaks a bound; the message is shown to the model."""


def _bounded(value: float | int) -> float | int:
    if isinstance(value, float) and not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
        raise CalculatorError(f"a result is too large (the limit is {MAX_MAGNITUDE:.0e})")
    return value


def _power(base: float | int, exponent: float | int) -> float | int:
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"the exponent {exponent} is too large (the limit is {MAX_EXPONENT})")
    if base == 0 and exponent < 0:
        raise CalculatorError("0 cannot be raised to a negative power")
    if base != 0 and exponent * math.log10(abs(base)) > math.log10(MAX_MAGNITUDE):  # refused before computing
        raise CalculatorError(f"a result is too large (the limit is {MAX_MAGNITUDE:.0e})")
    result = base**exponent
    if isinstance(result, complex):
        raise CalculatorError("a negative number cannot be raised to a fractional power")
    return result


def _evaluate(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            return _bounded(_power(left, right))
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise CalculatorError("division by zero")
        return _bounded(_BINARY[type(node.op)](left, right))
    what = type(getattr(node, "op", node))
    raise CalculatorError(
        f"{what.__name__} is not allowed; {_HINTS.get(what, 'only numbers, + - * / // % ** and ( )')}"
    )


def calculate(expression: str) -> str:
    """The value of ``expression`` as text (integers without a decimal point, others to 10 significant digits)."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalculatorError("the expression must be a non-empty string")
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"cannot parse {expression!r} as arithmetic") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalculatorError(f"the expression has more than {MAX_NODES} parts")
    value = _evaluate(tree.body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value) if isinstance(value, int) else f"{value:.10g}"


class CalculatorTool(BaseTool):
    """``calculator(expression)``: the value of an arithmetic expression; errors come back as the message.

    ``config.result_template`` (default ``"{result}"``) is the text of a successful call's tool turn, e.g. a
    reminder of the answer format the task's reward reads (``conf/tools/arith_calculator.yaml``).
    """

    default_schema = {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "for example (12 + 30) * 2"}},
                "required": ["expression"],
            },
        },
    }

    def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        try:
            result = calculate(parameters.get("expression", ""))
            return ToolResponse(text=self.config.get("result_template", "{result}").format(result=result)), 0.0, {}
        except CalculatorError as exc:
            return ToolResponse(text=f"Error: {exc}"), 0.0, {"error": 1}
