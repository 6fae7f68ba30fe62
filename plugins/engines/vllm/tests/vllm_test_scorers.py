"""A scorer for the vLLM training test (importable by reward worker processes)."""


def vowel_fraction(response: str, label, metadata) -> float:
    """Fraction of the response's letters that are vowels: varies between samples even for
    a random model, so the advantages are not all zero."""
    letters = [c for c in response.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0
