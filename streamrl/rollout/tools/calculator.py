"""Safe arithmetic for the ``calculator`` tool: ``ast`` nodes walked by hand, never ``eval``.

Numbers, ``+ - * / // % **``, unary ``+``/``-`` and parentheses; nothing else (names,
attributes, calls, subscripts, strings, comparisons are refused with a message naming
what was found). Integers stay exact; ``/`` gives a float, written with up to 12
significant digits and without a trailing ``.0``. Size is bounded before it is paid
for: an integer power whose result would exceed :data:`MAX_DIGITS` digits is refused
before it is computed, so ``9**9**9`` fails at once.

>>> calculate("1234*5678"), calculate("7/2"), calculate("6/3"), calculate("-(2+3)**2")
('7006652', '3.5', '2', '-25')
>>> calculate("2**100")
'1267650600228229401496703205376'
>>> calculate("9**9**9")
Traceback (most recent call last):
...
ValueError: the result of 9 ** 387420489 would have about 369693100 digits (at most 1000)
>>> calculate("__import__('os')")
Traceback (most recent call last):
...
ValueError: function calls are not allowed (only numbers and + - * / // % **)
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

MAX_EXPRESSION_CHARS = 500
MAX_DIGITS = 1000
_LIMIT = 10**MAX_DIGITS  # the smallest integer with too many digits

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_REFUSED = {
    ast.Name: "names are",
    ast.Attribute: "attribute access is",
    ast.Call: "function calls are",
    ast.Subscript: "subscripts are",
    ast.Compare: "comparisons are",
    ast.BoolOp: "boolean operators are",
    ast.Lambda: "lambdas are",
    ast.IfExp: "conditional expressions are",
}
_ALLOWED = "only numbers and + - * / // % **"


def calculate(expression: str) -> str:
    """The value of an arithmetic expression, as text; ValueError explains a refusal."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.strip()
    if not text:
        raise ValueError("the expression is empty")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression ({exc.msg})") from None
    except (ValueError, RecursionError, MemoryError):
        raise ValueError("not an arithmetic expression") from None
    try:
        value = _evaluate(tree.body)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except OverflowError:
        raise ValueError("the result is too large") from None
    except RecursionError:
        raise ValueError("the expression is nested too deeply") from None
    return format_number(value)


def format_number(value: float) -> str:
    """Integers exactly; floats with 12 significant digits, integral ones without ``.0``.

    >>> format_number(7006652), format_number(1/3), format_number(2.0), format_number(1e20)
    ('7006652', '0.333333333333', '2', '1e+20')
    >>> format_number(0.1 + 0.2), format_number(-0.0)
    ('0.3', '0')
    """
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        raise ValueError("the result is too large")
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return format(value, ".12g")


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{type(value).__name__} values are not allowed ({_ALLOWED})")
        return _checked(value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _checked(_BINARY[type(node.op)](left, right))
    for kind, words in _REFUSED.items():
        if isinstance(node, kind):
            raise ValueError(f"{words} not allowed ({_ALLOWED})")
    if isinstance(node, ast.BinOp | ast.UnaryOp):
        raise ValueError(f"the operator {type(node.op).__name__} is not allowed ({_ALLOWED})")
    raise ValueError(f"{type(node).__name__} is not allowed ({_ALLOWED})")


def _check_power(base: int | float, exponent: int | float) -> None:
    """Refuse an integer power whose result would be too large, before computing it.

    Float powers are cheap whatever the exponent (they overflow or underflow at once),
    and an integer base of 0 or +-1 stays small.
    """
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        digits = math.floor(exponent * math.log10(abs(base))) + 1
        if digits > MAX_DIGITS:
            raise ValueError(
                f"the result of {base} ** {exponent} would have about {digits} digits "
                f"(at most {MAX_DIGITS})"
            )


def _checked(value: int | float | complex) -> int | float:
    """A real, finite result of at most MAX_DIGITS digits."""
    if isinstance(value, complex):
        raise ValueError("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result is too large")
    if isinstance(value, int) and abs(value) >= _LIMIT:
        raise ValueError(f"the result has more than {MAX_DIGITS} digits")
    return value
