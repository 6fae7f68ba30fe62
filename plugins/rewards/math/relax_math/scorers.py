"""The ``math`` and ``gsm8k`` scorers: ``fn(response, label, metadata) -> float | None``.

``math`` (reward 1 = correct, 0 = wrong or no final answer, ``None`` = label unparseable):

1. final answer: the content of the **last** ``\\boxed{}`` / ``\\fbox{}`` (balanced braces;
   an unclosed last box means a truncated response and gives 0).  With
   ``--math-answer-format anchors``, when there is no box: the last ``<answer>...</answer>``,
   else the last ``Answer:`` line, else the last ``#### N``.
2. label: a string (a GSM8K-form ``... #### N`` label gives ``N``), an int or a float.  A
   label that is not mathematics (words such as ``"see figure"``) cannot be scored: ``None``.
3. equivalence: two plain numbers (thousands separators and ``$`` accepted) are compared
   numerically (relative 1e-6); anything else with math-verify (``\\frac12`` = ``0.5``,
   ``2^{10}`` = ``1024``, ``x+1`` = ``1+x``).

math-verify is called with ``parsing_timeout=None`` and ``timeout_seconds=None`` (its own
timeouts use ``signal.alarm``, main thread only); :func:`relax_core.rewarding.score_batch`
enforces ``--reward-timeout``.

``gsm8k``: the label's number (after ``####``, or the label itself) against the response's
last boxed answer, else its last number; thousands separators and a leading ``$`` accepted.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from relax_core.answers import (answer_line, answer_tag, gsm8k_final, last_boxed, last_number,
                                numbers_equal, parse_number, strip_math)


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


def _mv_parse(text: str) -> list:
    from math_verify import parse

    return parse(f"${text}$", parsing_timeout=None)


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
            return float(numbers_equal(pred_num, gold_num))
        gold = _mv_parse(gold_text)
        if not gold:
            return None
        pred = _mv_parse(answer)
        if not pred:
            return 0.0
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
    pred = parse_number(candidate)
    if pred is None:
        found = last_number(candidate)
        pred = parse_number(found) if found is not None else None
    return 0.0 if pred is None else float(numbers_equal(pred, gold))


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
