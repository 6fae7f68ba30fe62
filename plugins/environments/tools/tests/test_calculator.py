"""The calculator: exact values derived by hand, the grammar's refusals (no eval: names,
calls, attributes, strings), and the limits that keep a call cheap."""

import time
from fractions import Fraction

import pytest

from relax_tools.calculator import MAX_BITS, calculator, evaluate, format_number, parse


@pytest.mark.parametrize("expr, value", [
    ("2+3*4", "14"), ("(2+3)*4", "20"), ("7//2", "3"), ("-7//2", "-4"), ("-7%3", "2"), ("2**10", "1024"),
    ("2^10", "1024"), ("2**-2", "0.25"), ("0**0", "1"), ("(-1)**1000001", "-1"), ("-(3)", "-3"), ("+4", "4"),
    ("0.1+0.2", "0.3"),             # exact decimals: a float sum would be 0.30000000000000004
    ("1/3+1/6", "0.5"), ("1/7*7", "1"), ("1.5e3", "1500"), ("3.14159*2", "6.28318"), ("-1/8", "-0.125"),
    ("1/3", "1/3 (≈ 0.333333333333)"), ("-2/3", "-2/3 (≈ -0.666666666667)"),
    ("123456789*987654321", "121932631112635269"),
])
def test_values_by_hand(expr, value):
    assert calculator(expr) == value


def test_values_are_exact_fractions():
    assert evaluate(parse("1/3 + 1/3 + 1/3")) == 1
    assert evaluate(parse("0.1 * 3")) == Fraction(3, 10)
    assert format_number(Fraction(1, 40)) == "0.025" and format_number(Fraction(-5, 1)) == "-5"


@pytest.mark.parametrize("expr, why", [
    ("__import__('os').system('echo pwned')", "'Call' is not allowed"),
    ("().__class__.__bases__", "'Attribute' is not allowed"),
    ("x + 1", "'Name' is not allowed"),
    ("'a' * 3", "'Constant' is not allowed"),
    ("True + 1", "'Constant' is not allowed"),
    ("[1] * 10", "'List' is not allowed"),
    ("(lambda: 1)()", "'Call' is not allowed"),
    ("1 if 1 else 2", "'IfExp' is not allowed"),
    ("1 < 2", "'Compare' is not allowed"),
    ("1j * 2", "'Constant' is not allowed"),
    ("import os", "not an arithmetic expression"),
    ("1 +", "not an arithmetic expression"),
    ("1/0", "division by zero"), ("5 % 0", "division by zero"), ("0 ** -1", "division by zero"),
    ("2 ** 0.5", "the exponent must be an integer"),
    ("1e999", "not finite"),
])
def test_refusals(expr, why):
    out = calculator(expr)
    assert out.startswith("error: ") and why in out, out


def test_huge_results_are_refused_before_they_are_computed():
    t0 = time.monotonic()
    for expr in ("9**9**9", "10**100000", "2**4097", "(2**4000)*(2**4000)", "(1/3)**5000"):
        assert calculator(expr) == f"error: the result is too large (more than {MAX_BITS} bits)", expr
    assert time.monotonic() - t0 < 1.0
    assert calculator("2**4095") == str(2**4095)


def test_size_limits():
    assert calculator("(" * 200 + "1" + ")" * 200) == "error: the expression is longer than 256 characters"
    assert "more than 64 parts" in calculator("+".join(["1"] * 40))
    assert calculator(None) == "error: the expression must be a string"
