"""relax-hf: the default rollout engine (Hugging Face transformers, CPU or CUDA)."""
