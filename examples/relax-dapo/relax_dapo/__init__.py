"""relax-dapo: DAPO's decoupled-clip, token-level policy objective for Relax."""
