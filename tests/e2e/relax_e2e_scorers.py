"""Scorers for the end-to-end tests (importable by the reward worker processes, which get
the parent's ``sys.path``)."""


def vowel_fraction(response: str, label, metadata) -> float:
    """Fraction of the response's letters that are vowels: varies from sample to sample
    even for a random model, so advantages are not all zero."""
    letters = [c for c in response.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0


def brevity(response: str, label, metadata) -> float:
    """1 for an empty response, falling linearly to 0 at 60 characters: a dense signal the
    default model can follow within a few steps (it can end its answer sooner)."""
    return max(0.0, 1.0 - len(response) / 60.0)


def prompt_length(response: str, label, metadata) -> float:
    """Length of the prompt text the scorer was given (``metadata["prompt"]``), -1 without one."""
    return float(len(metadata["prompt"])) if "prompt" in metadata else -1.0


def always_zero(response: str, label, metadata) -> float:
    """0 for every response, the correct label included (a scorer the label check refuses)."""
    return 0.0
