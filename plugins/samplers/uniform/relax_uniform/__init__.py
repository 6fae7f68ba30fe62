"""The ``uniform`` prompt sampler for Relax (``--sampler uniform``, the default)."""
