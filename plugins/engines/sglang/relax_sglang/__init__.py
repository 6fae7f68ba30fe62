"""relax-sglang: SGLang rollout engine (GPU only; install the ``[engine]`` extra)."""
