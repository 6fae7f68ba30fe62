"""relax-single-turn: the default environment (prompt -> one completion)."""
