"""Final-answer extraction shared by the scorers (relax_answers)."""

import pytest

from relax_answers import (
    answer_line,
    answer_tag,
    gsm8k_final,
    last_boxed,
    last_number,
    numbers_equal,
    parse_number,
    strip_math,
)


@pytest.mark.parametrize("text, expected", [
    ("so \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("First \\boxed{5}. No, that is wrong: \\boxed{7}.", "7"),
    ("\\fbox{42}", "42"),
    ("\\boxed {x}", "x"),
    ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),                # escaped braces are not structure
    ("\\boxed{a^{b^{c}}} tail", "a^{b^{c}}"),
    ("\\boxed{\\frac{1}{2}", None),                       # unclosed: truncated
    ("\\boxed{5} and then \\boxed{7", None),              # the last box is unclosed
    ("no box", None),
    ("\\boxed{}", ""),
])
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_anchors():
    assert answer_tag("<answer> 1 </answer> x <ANSWER>2</ANSWER>") == "2"
    assert answer_tag("<answer>unclosed") is None
    assert answer_line("Work.\nAnswer: $13$\n") == "$13$"
    assert answer_line("Final answer: 5") == "5"
    assert answer_line("Answer:\n5") is None
    assert gsm8k_final("a\n#### 1,234\n") == "1,234"
    assert gsm8k_final("####") is None and gsm8k_final("none") is None


@pytest.mark.parametrize("text, expected", [
    ("115,000", 115000.0), ("$1,234.00", 1234.0), ("\\$18", 18.0), ("-3", -3.0), ("\\text{13}", 13.0),
    ("$13$", 13.0), ("0.5", 0.5), (".5", 0.5), ("18.", 18.0), (3, 3.0), (3.0, 3.0),
    ("1,23", None), ("12,3456", None), ("see figure", None), ("1/2", None), (True, None), (float("inf"), None),
])
def test_parse_number(text, expected):
    assert parse_number(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("so she makes $18 every day.", "$18"),
    ("57 + 87 - 70", "70"),           # a binary minus is not a sign
    ("2 + -1", "-1"),
    ("x = -61.", "-61"),
    ("(4-9)", "9"),
    ("total 1,234,567 items", "1,234,567"),
    ("none", None),
])
def test_last_number(text, expected):
    assert last_number(text) == expected


def test_strip_math_and_equality():
    assert strip_math("\\(x+1\\)") == "x+1"
    assert strip_math("$$5$$.") == "5"
    assert strip_math("\\text{E}") == "E"
    assert numbers_equal(0.1 + 0.2, 0.3) and not numbers_equal(1.0, 1.001)
    assert numbers_equal(1e9, 1e9 + 1) and not numbers_equal(0.0, 1e-6)
