"""relax-torch: the default training backend (plain PyTorch over transformers models)."""
