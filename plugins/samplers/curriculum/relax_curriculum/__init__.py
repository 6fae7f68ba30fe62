"""The ``curriculum`` prompt sampler for Relax (``--sampler curriculum --data rgc:<dataset>``)."""
