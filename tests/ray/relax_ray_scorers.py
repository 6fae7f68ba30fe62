"""A cheap deterministic scorer for the Ray tests: the fraction of vowels in the response."""


def vowel_fraction(response: str, label: str, metadata: dict) -> float:
    letters = [c for c in response.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0
