"""The ``gsm8k:`` file format: GSM8K records (``question`` / ``answer … #### N``) as rows.

Cobbe et al. 2021, *Training Verifiers to Solve Math Word Problems*: every solution ends in a
line ``#### <number>``.  A row is ``{"prompt": question, "label": N, "metadata": {"source":
"gsm8k", "scorer": "gsm8k"}}``, ``N`` with its thousands separators removed.  The core reads
the file (JSONL line by line, JSON, Parquet) and names a bad record by file and line
(:class:`relax_core.specs.DataSourceSpec`, ``file_keys``); a bare file path whose first
record has ``question`` and ``answer`` (and not the prompt/label keys) is read by this format
too.
"""

from __future__ import annotations

from typing import Any, Callable

from relax_answers import parse_number


def gsm8k_label(answer: str) -> str:
    """The final number of a GSM8K answer (``… #### 1,234`` → ``"1234"``).

    Raises:
        ValueError: no ``####`` marker in ``answer``.
    """
    if "####" not in answer:
        raise ValueError("GSM8K answer has no '#### <number>' line")
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def gsm8k_row(record: dict) -> dict:
    """One row from one GSM8K record.

    Raises:
        ValueError: ``question`` or ``answer`` is not a string, or the answer has no ``####``.
    """
    q, a = record.get("question"), record.get("answer")
    if not isinstance(q, str) or not isinstance(a, str):
        raise ValueError("GSM8K row needs string 'question' and 'answer'")
    return {"prompt": q, "label": gsm8k_label(a), "metadata": {"source": "gsm8k", "scorer": "gsm8k"}}


def build_source(params: Any, config: Any) -> Callable[[dict], dict]:
    """The ``gsm8k`` data source's factory: the record converter :func:`gsm8k_row`."""
    return gsm8k_row


def is_number(label: Any) -> bool:
    """``RewardScorerSpec.auto_labels`` of the ``gsm8k`` scorer: a label that is a plain
    number (``"13"``, ``42``, ``"1,234"``, ``"$5"``) is scored on the response's final number."""
    return parse_number(label) is not None
