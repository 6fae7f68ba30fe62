"""The golden runs' scorer (importable by the reward worker processes and Ray actors)."""


def vowel_fraction(response: str, label, metadata) -> float:
    """Fraction of the response's letters that are vowels: varies from sample to sample
    even for a random model, so advantages are not all zero."""
    letters = [c for c in response.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0
