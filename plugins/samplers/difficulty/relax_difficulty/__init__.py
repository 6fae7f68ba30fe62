"""The ``difficulty`` prompt sampler for Relax (``--sampler difficulty``)."""
