"""Remote reward scorer for Relax (``remote``): asks a reward server over HTTP."""
