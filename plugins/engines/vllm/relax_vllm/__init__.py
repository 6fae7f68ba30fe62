"""relax-vllm: vLLM rollout engine (install the ``[engine]`` extra, see its pyproject)."""
