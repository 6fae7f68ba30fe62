"""The ``calculator`` tool: exact rational arithmetic on a small expression grammar.

Never ``eval``: the expression is parsed with :func:`ast.parse` (``mode="eval"``) and the
tree is walked by :func:`evaluate`, which accepts only these nodes and refuses everything
else (names, calls, attributes, subscripts, strings, booleans, comprehensions, lambdas):

    expr   := number | (expr) | +expr | -expr | expr op expr
    op     := +  -  *  /  //  %  **        (``^`` is read as ``**``)
    number := an int or decimal literal (``12``, ``0.1``, ``1e3``)

Values are :class:`fractions.Fraction`, so ``0.1 + 0.2`` is exactly ``0.3`` and ``1/3 + 1/6``
is exactly ``1/2`` (decimal literals are read as the decimal they spell).  Limits keep every
call cheap: at most :data:`MAX_CHARS` characters and :data:`MAX_NODES` tree nodes, an
integer exponent, and every intermediate result within :data:`MAX_BITS` bits of numerator
and denominator (a power whose result would have more than twice that, ``9**9**9`` or
``10**100000``, is refused before it is computed).
Errors are returned as text for the model to read (:func:`calculator`), never raised.
"""

from __future__ import annotations

import ast
import math
import operator
from fractions import Fraction

MAX_CHARS = 256
MAX_NODES = 64
MAX_BITS = 4096

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """An expression the calculator refuses (the message says why)."""


def _bits(x: Fraction) -> int:
    return max(x.numerator.bit_length(), x.denominator.bit_length())


def _checked(x: Fraction) -> Fraction:
    if _bits(x) > MAX_BITS:
        raise CalculatorError(f"the result is too large (more than {MAX_BITS} bits)")
    return x


def _power(base: Fraction, exp: Fraction) -> Fraction:
    if exp.denominator != 1:
        raise CalculatorError("the exponent must be an integer")
    if base == 0:
        if exp < 0:
            raise CalculatorError("division by zero")
        return Fraction(1 if exp == 0 else 0)
    if base in (1, -1):  # |result| is 1 for any exponent
        return Fraction(-1 if base == -1 and exp.numerator % 2 else 1)
    if _bits(base) * abs(exp.numerator) > 2 * MAX_BITS:  # at least half that size: refused before computing
        raise CalculatorError(f"the result is too large (more than {MAX_BITS} bits)")
    return _checked(base ** int(exp))


def evaluate(node: ast.AST) -> Fraction:
    """The exact value of a parsed expression.

    Raises:
        CalculatorError: a node outside the grammar, a non-integer exponent, division by
            zero, or a result beyond :data:`MAX_BITS`.
    """
    if isinstance(node, ast.Expression):
        return evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if not math.isfinite(node.value):
            raise CalculatorError(f"the number {node.value} is not finite")
        return _checked(Fraction(node.value) if isinstance(node.value, int) else Fraction(repr(node.value)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](evaluate(node.operand))
    if isinstance(node, ast.BinOp):
        left, right = evaluate(node.left), evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        if type(node.op) in _BINARY:
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
                raise CalculatorError("division by zero")
            return _checked(Fraction(_BINARY[type(node.op)](left, right)))
    raise CalculatorError(f"'{type(node).__name__}' is not allowed: use numbers, + - * / // % ** and parentheses")


def parse(expression: str) -> ast.Expression:
    """The expression's tree (``^`` read as ``**``).

    Raises:
        CalculatorError: too long, not an expression, or more than :data:`MAX_NODES` nodes."""
    if not isinstance(expression, str):
        raise CalculatorError("the expression must be a string")
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.replace("^", "**").strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError) as e:
        raise CalculatorError(f"not an arithmetic expression ({type(e).__name__})") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalculatorError(f"the expression has more than {MAX_NODES} parts")
    return tree


def format_number(x: Fraction) -> str:
    """``x`` exactly: an integer, a terminating decimal, or ``p/q`` with a 12-digit decimal."""
    if x.denominator == 1:
        return str(x.numerator)
    d, twos, fives = x.denominator, 0, 0
    while d % 2 == 0:
        d, twos = d // 2, twos + 1
    while d % 5 == 0:
        d, fives = d // 5, fives + 1
    if d == 1:  # terminating: k = max(twos, fives) decimal places
        k = max(twos, fives)
        digits = str(abs(x.numerator) * 10**k // x.denominator).rjust(k + 1, "0")
        return f"{'-' if x < 0 else ''}{digits[:-k]}.{digits[-k:]}"
    return f"{x.numerator}/{x.denominator} (≈ {float(x):.12g})"


def calculator(expression: str) -> str:
    """The tool: the exact value of ``expression`` as text, or ``"error: <why>"``."""
    try:
        return format_number(evaluate(parse(expression)))
    except CalculatorError as e:
        return f"error: {e}"


#: the tool's JSON schema (OpenAI / Hermes function-calling style)
SCHEMA = {"type": "function", "function": {
    "name": "calculator",
    "description": "Exact arithmetic: + - * / // % ** and parentheses on integers and decimals.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 12*(3+4)"}},
                   "required": ["expression"]}}}
