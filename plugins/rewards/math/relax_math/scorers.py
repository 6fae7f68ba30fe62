"""The ``math`` and ``gsm8k`` scorers: ``fn(response, label, metadata) -> float | None``.

``math`` (reward 1 = correct, 0 = wrong or no final answer, ``None`` = label unparseable):

1. final answer: the content of the **last** ``\\boxed{}`` / ``\\fbox{}`` (balanced braces;
   an unclosed last box means a truncated response and gives 0).  With
   ``--math-answer-format anchors``, when there is no box: the last ``<answer>...</answer>``,
   else the last ``Answer:`` line, else the last ``#### N``.
2. label: a string (a GSM8K-form ``... #### N`` label gives ``N``), an int or a float.  A
   label that is not mathematics (words such as ``"see figure"``) cannot be scored: ``None``.
3. equivalence: two plain integers are compared exactly, two plain numbers with a decimal
   part numerically (relative 1e-6; thousands separators and ``$`` accepted); anything else
   with math-verify (``\\frac12`` = ``0.5``, ``2^{10}`` = ``1024``, ``x+1`` = ``1+x``), with the
   guards it lacks (a false positive, reward for a wrong answer, is worse than a false
   negative):

   - both sides exact rationals (integers, fractions, integer powers, factorials, sums and
     products of them; no decimals, which math-verify compares with its rounding, so that
     ``0.5`` = ``\\frac{1}{2}``): compared exactly.  math-verify compares a numerically evaluated
     difference with chopping, so ``\\frac{1}{10^{20}}`` = ``\\frac{3}{10^{20}}`` and
     ``\\frac{1}{2^{99}}`` = ``\\frac{1}{2^{98}}`` (Math-Verify issue #14) scored 1;
   - shorthands it misreads are rewritten first: ``\\sqrt(x)`` → ``\\sqrt{x}`` (it dropped
     ``\\sqrt(`` and read ``7\\sqrt(3)`` as 7), ``\\mathrm{e}`` → ``e`` (it dropped the term:
     ``1 - \\frac{1}{\\mathrm{e}}`` = ``1 + \\frac{1}{\\mathrm{e}}``), a repeating decimal
     ``0.1\\overline{6}`` → ``\\frac{1}{6}`` (it read 0.1);
   - a text whose parse loses a digit (``12:00`` read as ``zoo``), outside the constructs that
     evaluate (fractions, binomials, factorials, decimals, percentages), is unparseable.

math-verify is called with ``parsing_timeout=None`` and ``timeout_seconds=None`` (its own
timeouts use ``signal.alarm``, main thread only); :func:`relax_core.stages.rewarding.score_batch`
enforces ``--reward-timeout``.

``gsm8k``: the label's number (after ``####``, or the label itself) against the response's
last boxed answer, else its last number; thousands separators and a leading ``$`` accepted;
two integers compare exactly, decimals with a relative 1e-6.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from relax_answers import (
    answer_line,
    answer_tag,
    gsm8k_final,
    integer_value,
    last_boxed,
    last_number,
    numbers_equal,
    parse_number,
    strip_math,
)


def _not_timeout_notice(record: logging.LogRecord) -> bool:
    """math-verify warns once per process that its timeouts are off; here they are off on
    purpose (``score_batch`` enforces ``--reward-timeout``), so that one notice is dropped."""
    return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_not_timeout_notice)

# words that may appear in a mathematical label outside a LaTeX command
_MATH_WORDS = frozenset("""sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln lg exp sqrt
    pi inf infty oo mod gcd lcm det max min lim and or""".split())
_COMMAND_RE = re.compile(r"\\[A-Za-z]+")
_WORD_RE = re.compile(r"[A-Za-z]{2,}")


def final_answer(response: str, answer_format: str = "boxed") -> str | None:
    """The response's final answer text (see the module docstring), or ``None``."""
    boxed = last_boxed(response)
    if boxed is not None or answer_format == "boxed":
        return boxed
    for extract in (answer_tag, answer_line, gsm8k_final):
        found = extract(response)
        if found is not None:
            return last_boxed(found) or found
    return None


def label_text(label: Any) -> str | None:
    """The label as the answer text to compare with, or ``None`` if it is not mathematics
    (empty, or holding words outside LaTeX commands and known function names, such as
    ``"see figure"``; a trailing unit after a number, ``"5 cm"``, is allowed)."""
    if isinstance(label, bool) or label is None:
        return None
    if isinstance(label, (int, float)):
        n = parse_number(label)
        return None if n is None else repr(label)
    text = str(label)
    if "####" in text:
        text = gsm8k_final(text) or ""
    text = strip_math(text)
    if not text:
        return None
    words = [w for w in _WORD_RE.findall(_COMMAND_RE.sub(" ", text)) if w.lower() not in _MATH_WORDS]
    if words and not re.search(r"\d", text):
        return None
    return text


_SQRT_PAREN_RE = re.compile(r"\\sqrt\s*\(")
_CONST_E_RE = re.compile(r"\\(?:mathrm|operatorname|mathit)\s*\{\s*e\s*\}")
_REPEATING_RE = re.compile(r"(\d*)\.(\d*)\\overline\s*\{(\d+)\}")
_EVALUATING_RE = re.compile(r"\\[dt]?frac|\\binom|\\choose|!|\.\d|%")
_DECIMAL_RE = re.compile(r"\d*\.\d")
_MAX_EXACT_EXPONENT = 10_000
_MAX_EXACT_FACTORIAL = 10_000


def normalize_latex(text: str) -> str:
    """Rewrite the shorthands math-verify misreads (module docstring, step 3):
    ``\\sqrt(x)`` → ``\\sqrt{x}`` (balanced parentheses), ``\\mathrm{e}`` → ``e``, and a
    repeating decimal ``a.b\\overline{c}`` → its exact ``\\frac{p}{q}``."""
    out, i = [], 0
    for m in _SQRT_PAREN_RE.finditer(text):
        if m.start() < i:
            continue
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[j], 0)
            j += 1
        if depth:  # unbalanced: left as written (the digit guard then refuses it)
            continue
        out += [text[i:m.start()], "\\sqrt{", text[m.end():j - 1], "}"]
        i = j
    text = "".join(out) + text[i:]
    text = _CONST_E_RE.sub("e", text)

    def repeating(m: re.Match) -> str:
        whole, fixed, rep = m.group(1) or "0", m.group(2), m.group(3)
        num = int(whole + fixed + rep) - int(whole + fixed)
        den = 10 ** len(fixed) * (10 ** len(rep) - 1)
        return f"\\frac{{{num}}}{{{den}}}"

    return _REPEATING_RE.sub(repeating, text)


def _digits_lost(text: str, parsed: list) -> bool:
    """Whether the parse dropped digits of ``text`` (a digit written more often than the
    parsed expression holds it), outside constructs that legitimately evaluate."""
    if _EVALUATING_RE.search(text):
        return False
    have = str(parsed[0])
    return any(text.count(d) > have.count(d) for d in set(filter(str.isdigit, text)))


def _mv_parse(text: str) -> list:
    """math-verify's parse of ``text`` after :func:`normalize_latex`; ``[]`` when
    unparseable or when the parse lost digits (:func:`_digits_lost`)."""
    from math_verify import parse

    text = normalize_latex(text)
    parsed = parse(f"${text}$", parsing_timeout=None)
    return [] if parsed and _digits_lost(text, parsed) else parsed


def exact_rational(expr: Any) -> Any:
    """``expr`` as an exact ``sympy.Rational`` when it is built only of integers and
    rationals with ``+``, ``×``, integer powers and factorials (e.g. ``1/10**20``,
    ``(2**2005 + 1)/(3·2**2006)``, ``factorial(5)``), else ``None`` (symbols, floats,
    irrationals, sets; exponents above 10 000 or factorials above 10 000 are not evaluated)."""
    import sympy

    if isinstance(expr, sympy.Rational):
        return expr
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        parts = [exact_rational(a) for a in expr.args]
        if any(p is None for p in parts):
            return None
        return sympy.Add(*parts) if isinstance(expr, sympy.Add) else sympy.Mul(*parts)
    if isinstance(expr, sympy.Pow):
        base, exp = exact_rational(expr.base), exact_rational(expr.exp)
        if base is None or exp is None or not exp.is_Integer or abs(exp) > _MAX_EXACT_EXPONENT or (base == 0 and exp < 0):
            return None
        return base ** exp
    if isinstance(expr, sympy.factorial):
        n = exact_rational(expr.args[0])
        return sympy.factorial(n) if n is not None and n.is_Integer and 0 <= n <= _MAX_EXACT_FACTORIAL else None
    return None


@dataclass(frozen=True)
class MathScorer:
    """The ``math`` scorer (picklable; math-verify imported on first call)."""

    answer_format: str = "boxed"

    def extract_answer(self, response: str, label: Any = None, metadata: dict | None = None) -> str | None:
        """The final answer this scorer compares with the label."""
        return final_answer(response, self.answer_format)

    def __call__(self, response: str, label: Any, metadata: dict | None = None) -> float | None:
        gold_text = label_text(label)
        if gold_text is None:
            return None
        gold_num = parse_number(gold_text)
        answer = final_answer(response, self.answer_format)
        if answer is None:
            return 0.0 if gold_num is not None or _mv_parse(gold_text) else None
        answer = strip_math(answer)
        pred_num = parse_number(answer)
        if gold_num is not None and pred_num is not None:
            exact = integer_value(gold_text), integer_value(answer)
            if None not in exact:
                return float(exact[0] == exact[1])
            return float(numbers_equal(pred_num, gold_num))
        gold = _mv_parse(gold_text)
        if not gold:
            return None
        pred = _mv_parse(answer)
        if not pred:
            return 0.0
        exact = exact_rational(gold[0]), exact_rational(pred[0])
        if None not in exact and not _DECIMAL_RE.search(gold_text + " " + answer):  # decimals: math-verify's rounding
            return float(exact[0] == exact[1])
        from math_verify import verify

        return float(verify(gold, pred, timeout_seconds=None))


def gsm8k_score(response: str, label: Any, metadata: dict | None = None) -> float | None:
    """The ``gsm8k`` scorer (see the module docstring)."""
    if isinstance(label, str) and "####" in label:
        label = gsm8k_final(label) or ""
    gold = parse_number(label) if label is not None else None
    if gold is None:
        return None
    boxed = last_boxed(response)
    candidate = boxed if boxed is not None else response
    text = candidate
    pred = parse_number(candidate)
    if pred is None:
        text = last_number(candidate)
        pred = parse_number(text) if text is not None else None
    if pred is None:
        return 0.0
    exact = integer_value(label), integer_value(text)
    return float(exact[0] == exact[1]) if None not in exact else float(numbers_equal(pred, gold))


def _gsm8k_answer(response: str, label: Any = None, metadata: dict | None = None) -> str | None:
    boxed = last_boxed(response)
    return boxed if boxed is not None else last_number(response)


gsm8k_score.extract_answer = _gsm8k_answer  # the answer it compares (for messages)


def build_math(params: Any, config: Any) -> MathScorer:
    """Build the scorer and warm math-verify up (its import and first LaTeX parse take
    seconds on a busy CPU): the reward workers build scorers outside the timed call, so
    this keeps a cold start from timing out a fresh worker's first sample."""
    scorer = MathScorer(answer_format=params.answer_format if params is not None else "boxed")
    scorer("\\boxed{\\frac{1}{2}}", "\\sqrt{x}", {})
    return scorer


def build_gsm8k(params: Any, config: Any):
    return gsm8k_score
