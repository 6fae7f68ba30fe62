"""relax-gymnasium: Gymnasium environments as multi-turn Relax episodes."""
