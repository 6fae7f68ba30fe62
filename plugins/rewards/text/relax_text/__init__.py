"""Text reward scorers for Relax: ``multiple_choice`` and ``f1``."""
