"""The reward both sides of ``benchmarks/e2e_trl.py`` use: 1.0 when the last number in the
response equals the label, else 0.0.  Pure Python and stdlib only, so that the TRL
environment can import it too (Relax runs it through ``--custom-rm-path e2e_reward:score``).
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def score(response: str, label: str, metadata: dict | None = None) -> float:
    """Relax's scorer signature ``(response, label, metadata) -> float``."""
    found = _NUMBER.findall(response.replace(",", ""))
    return 1.0 if found and float(found[-1]) == float(label) else 0.0


def trl_reward(completions: list, label: list, **kwargs) -> list[float]:
    """TRL's reward-function signature (conversational completions, dataset column ``label``)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [score(t, l) for t, l in zip(texts, label)]
