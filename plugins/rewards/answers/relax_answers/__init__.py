"""Final-answer extraction from model responses, shared by reward scorers.

Pure standard-library text functions (no math-verify, no torch), so any scorer plugin can
use them without extra dependencies.  Each returns ``None`` when the response holds no
answer of that form: scorers are strict, a missing or truncated answer is never guessed.

- :func:`last_boxed`: the content of the **last** ``\\boxed{...}`` / ``\\fbox{...}``, with
  nested braces balanced; ``None`` if that last box is not closed (a truncated response).
- :func:`answer_tag`: the content of the last ``<answer>...</answer>``.
- :func:`answer_line`: what follows the last ``Answer:`` anchor on its line.
- :func:`gsm8k_final`: what follows the last ``####`` (GSM8K solutions and labels).
- :func:`last_number` / :func:`parse_number`: numbers with thousands separators, a leading
  ``$`` and a sign (``"$1,234.00"`` → 1234.0).
"""

from __future__ import annotations

import math
import re

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_LINE_RE = re.compile(r"(?i)\banswer\s*:[ \t]*([^\n]*)")
# markdown emphasis markers at either end of an answer (a lone "_" or "*" inside is math)
_EMPHASIS_RE = re.compile(r"^(?:\*+|_{2,})\s*|\s*(?:\*+|_{2,})$")
_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
# a number: optional sign (not a binary minus: "5-3" holds 5 and 3), optional dollar,
# thousands-grouped or plain digits, optional decimals
_SIGN = r"(?:(?<![\w)\]])[-−])?"
_NUMBER = rf"{_SIGN}(?:\\?\$\s?)?(?:\d{{1,3}}(?:,\d{{3}})+|\d+)(?:\.\d+)?|{_SIGN}\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
_FULL_NUMBER_RE = re.compile(rf"^(?:{_NUMBER})$")


def _balanced(text: str, start: int) -> str | None:
    """Content between ``text[start - 1] == '{'`` and its matching ``}`` (escaped ``\\{``
    and ``\\}`` do not count); ``None`` if the brace is never closed."""
    depth, i = 1, start
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{}`` or ``\\fbox{}`` in ``text``.

    ``"First \\boxed{5}. No: \\boxed{7}."`` → ``"7"``; ``"\\boxed{\\frac{1}{2}}"`` →
    ``"\\frac{1}{2}"``.  If the last box is unclosed (``"\\boxed{\\frac{1}{2}"``, a response
    cut by the length limit) the result is ``None``: an earlier, retracted box is never used.
    """
    starts = [m.end() for m in _BOX_RE.finditer(text)]
    if not starts:
        return None
    inner = _balanced(text, starts[-1])
    return inner.strip() if inner is not None else None


def answer_tag(text: str) -> str | None:
    """Content of the last closed ``<answer>...</answer>`` (case-insensitive), stripped."""
    found = _TAG_RE.findall(text)
    return found[-1].strip() if found else None


def answer_line(text: str) -> str | None:
    """What follows the last ``Answer:`` anchor on its line (``"...\\nAnswer: $13$"`` →
    ``"$13$"``); ``None`` when there is no anchor or nothing after it."""
    found = [s.strip() for s in _LINE_RE.findall(text)]
    return found[-1] if found and found[-1] else None


def gsm8k_final(text: str) -> str | None:
    """What follows the last ``####`` on its line (``"...\\n#### 1,234"`` → ``"1,234"``)."""
    if "####" not in text:
        return None
    rest = text.rsplit("####", 1)[1].strip()
    return rest.splitlines()[0].strip() if rest else None


def strip_math(answer: str) -> str:
    """Remove what wraps a final answer: markdown emphasis (``**73**``, ``*73*``, ``__73__``,
    and the stray ``**`` of ``**Answer:** 73``), ``$...$``, ``\\(...\\)``, ``\\[...\\]``,
    ``\\text{...}`` around the whole answer and a trailing full stop, in any nesting
    (``**$73$**.`` → ``73``)."""
    s, previous = answer, None
    while s != previous:
        previous = s
        s = _EMPHASIS_RE.sub("", s.strip().rstrip(".").strip())
        for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left):len(s) - len(right)].strip()
                break
        m = _TEXT_RE.fullmatch(s)
        if m:
            s = m.group(1).strip()
    return s


def parse_number(answer: str | int | float) -> float | None:
    """The number an answer states, or ``None``.

    Accepts ints/floats, and strings such as ``"115,000"``, ``"$1,234.00"``, ``"-3"``,
    ``"\\$18"``, ``"\\text{13}"``, ``"$13$"``, ``"0.5"``.  Thousands separators must be
    well formed (``"1,23"`` is not a number).  Non-finite values give ``None``.
    """
    if isinstance(answer, bool):
        return None
    if isinstance(answer, (int, float)):
        v = float(answer)
        return v if math.isfinite(v) else None
    s = strip_math(str(answer))
    if not _FULL_NUMBER_RE.match(s):
        return None
    v = float(re.sub(r"[\s,$\\]", "", s).replace("−", "-"))
    return v if math.isfinite(v) else None


def integer_value(answer: str | int) -> int | None:
    """The exact integer an answer states when it is written as a plain integer (``"1,000,001"``,
    ``"$-3$"``, ``42``), else ``None`` (decimals, fractions, words).  Integers compare exactly:
    a relative tolerance would call 1000000 and 1000001 equal."""
    if isinstance(answer, bool):
        return None
    if isinstance(answer, int):
        return answer
    s = strip_math(str(answer))
    if not _FULL_NUMBER_RE.match(s) or "." in s:
        return None
    return int(re.sub(r"[\s,$\\]", "", s).replace("−", "-"))


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (as written, e.g. ``"$1,234"``), or ``None``."""
    found = _NUMBER_RE.findall(text)
    return found[-1].strip() if found else None


def numbers_equal(a: float, b: float, *, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Numeric equality used by the numeric scorers (relative 1e-6, absolute 1e-9)."""
    return math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)
