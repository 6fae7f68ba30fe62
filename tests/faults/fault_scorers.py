"""Scorers that fail on purpose, each once per run at the call given in the environment.

They run in the reward worker processes (which get the parent's ``sys.path`` and
environment).  ``RELAX_FAULT_AT``: comma-separated 1-based call numbers (with one worker,
the sample order of the run); ``RELAX_FAULT_DIR``: a directory where each fault leaves a
marker so that it fires once, also across replaced workers and resumed runs."""

from __future__ import annotations

import os
import signal
import time

_calls = 0


def vowel_fraction(response: str, label, metadata) -> float:
    """Fraction of the response's letters that are vowels (varies across samples)."""
    letters = [c for c in response.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0


def _fire(metadata: dict) -> bool:
    """Whether this call is one of ``RELAX_FAULT_AT`` that has not fired yet (the start-up
    label check's calls, ``metadata["label_check"]``, do not count)."""
    global _calls
    if metadata.get("label_check"):
        return False
    _calls += 1
    at = [int(x) for x in os.environ.get("RELAX_FAULT_AT", "").split(",") if x]
    if _calls not in at:
        return False
    try:
        os.close(os.open(os.path.join(os.environ["RELAX_FAULT_DIR"], f"fired-{_calls}"), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def ctrl_c(response, label, metadata):
    """Presses Ctrl-C as a terminal does: SIGINT to the whole process group (trainer and
    workers), in the middle of scoring a batch."""
    if _fire(metadata):
        os.killpg(os.getpgrp(), signal.SIGINT)
        time.sleep(0.2)  # still scoring when the signal lands
    return vowel_fraction(response, label, metadata)


def raises(response, label, metadata):
    if _fire(metadata):
        raise RuntimeError("injected scorer failure")
    return vowel_fraction(response, label, metadata)


def hangs(response, label, metadata):
    if _fire(metadata):
        time.sleep(3600)  # stuck, as a pathological sympy call would be
    return vowel_fraction(response, label, metadata)


def kills_its_worker(response, label, metadata):
    if _fire(metadata):
        os.kill(os.getpid(), signal.SIGKILL)
    return vowel_fraction(response, label, metadata)
