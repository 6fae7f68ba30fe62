"""The ``multiple_choice`` and ``f1`` scorers: ``fn(response, label, metadata) -> float | None``.

``multiple_choice``: the label is a letter (``"E"``, ``"(e)"``), or one of the option
texts in ``metadata["choices"]`` (a list; option ``i`` is letter ``A + i``).  The response's
choice is the letter in its last ``\\boxed{}`` (``\\boxed{\\text{E}}``), else its last
``<answer>...</answer>``, else its last ``Answer: X`` / ``answer is (X)``, else the response
itself when it is only a letter (``"(E)"``).  1 if it is the label's letter, 0 otherwise
(also when no choice is found); ``None`` when the label is not a letter or an option.

``f1``: SQuAD token F1 between the answer (the last ``<answer>`` tag or ``\\boxed{}``, else
the whole response) and the label (a string, or a list of acceptable strings: best F1).
Normalisation: lower case, punctuation and the articles a/an/the removed, whitespace split.
If either side is ``yes``/``no``/``noanswer`` and they differ, F1 is 0 (HotpotQA).
``None`` when the label is empty after normalisation.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

from relax_answers import answer_tag, last_boxed, strip_math

# a letter, alone or in parentheses, optionally followed by ")", "." or ":" and the option text
_LETTER_RE = re.compile(r"^\(?\s*([A-Za-z])\s*(?:[).:](?:\s.*)?)?$", re.DOTALL)
# "Answer: C", "the answer is (c)"; a bare lower-case letter is a word ("the answer is a cat")
_ANSWER_IS_RE = re.compile(r"\b[Aa]nswer(?:\s+is)?\s*[:：]?\s*(?:\(([A-Za-z])\)|([A-Z])(?![A-Za-z]))")


def letter_of(text: str | None) -> str | None:
    """``"E"``, ``"(e)"``, ``"E) Paris"``, ``"\\text{E}"``, ``"$E$"`` → ``"E"``; else ``None``."""
    if text is None:
        return None
    m = _LETTER_RE.match(strip_math(text))
    return m.group(1).upper() if m else None


def chosen_letter(response: str) -> str | None:
    """The letter the response chooses (see the module docstring), or ``None``."""
    for found in (last_boxed(response), answer_tag(response)):
        if found is not None:
            return letter_of(found)
    said = _ANSWER_IS_RE.findall(response)
    if said:
        return "".join(said[-1]).upper()
    return letter_of(response.strip()) if len(response.strip()) <= 4 else None


def multiple_choice_score(response: str, label: Any, metadata: dict | None = None) -> float | None:
    """The ``multiple_choice`` scorer."""
    if not isinstance(label, str):
        return None
    gold = letter_of(label) if len(label.strip()) <= 4 else None
    choices = (metadata or {}).get("choices")
    if gold is None and isinstance(choices, (list, tuple)) and label in choices:
        gold = string.ascii_uppercase[list(choices).index(label)]
    if gold is None:
        return None
    return float(chosen_letter(response) == gold)


_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
_YES_NO = frozenset({"yes", "no", "noanswer"})


def normalize_answer(text: str) -> list[str]:
    """SQuAD normalisation: lower case, no punctuation, no articles, split on whitespace."""
    return _ARTICLES_RE.sub(" ", str(text).lower().translate(_PUNCT)).split()


def token_f1(prediction: str, gold: str) -> tuple[float, float, float]:
    """``(f1, precision, recall)`` of the normalised tokens (SQuAD eq.: F1 = 2PR/(P+R)).

    ``token_f1("the brown fox", "a quick brown fox")`` → ``(0.8, 1.0, 2/3)``.
    """
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if (" ".join(pred) in _YES_NO or " ".join(ref) in _YES_NO) and pred != ref:
        return 0.0, 0.0, 0.0
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0, 0.0, 0.0
    p, r = common / len(pred), common / len(ref)
    return 2 * p * r / (p + r), p, r


def f1_score(response: str, label: Any, metadata: dict | None = None) -> float | None:
    """The ``f1`` scorer."""
    golds = [str(g) for g in (label if isinstance(label, (list, tuple)) else [label]) if g is not None]
    golds = [g for g in golds if normalize_answer(g)]
    if not golds:
        return None
    tag = answer_tag(response)
    answer = tag if tag is not None else last_boxed(response)
    answer = strip_math(answer) if answer is not None else response
    return max(token_f1(answer, g)[0] for g in golds)


def build_multiple_choice(params: Any, config: Any):
    return multiple_choice_score


def build_f1(params: Any, config: Any):
    return f1_score
