"""Reward post-processors for Relax (``--reward-processor``): ``overlong_penalty``,
``format``, ``length_penalty``, ``clip`` and ``zero_variance_filter``."""
