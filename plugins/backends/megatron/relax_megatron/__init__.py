"""relax-megatron: Megatron-core training backend (install the ``[backend]`` extra)."""
