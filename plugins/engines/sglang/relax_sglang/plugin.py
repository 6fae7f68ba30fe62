"""Hook implementations of relax-sglang (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import EngineCapabilities, EngineSpec, hookimpl, param

INSTALL_HINT = "pip install -e 'plugins/engines/sglang[engine]' (about 10 GB; needs a CUDA GPU and driver)"


@dataclass(frozen=True)
class SGLangParams:
    mode: str = param("server", "server: an SGLang HTTP server subprocess, weights pushed from disk; engine: "
                      "in-process sglang.Engine (colocated), weights pushed as tensors.",
                      flag="--sglang-mode", choices=("server", "engine"))
    mem_fraction_static: float = param(0.5, "Fraction of GPU memory for weights + KV cache (--mem-fraction-static).",
                                       flag="--sglang-mem-fraction-static", gt=0, lt=1)
    port: int = param(0, "Server port on 127.0.0.1 (0 = a free port).", flag="--sglang-port", ge=0, le=65535)
    context_length: int = param(0, "Max prompt + response tokens (0 = the model's own).",
                                flag="--sglang-context-length", unit="tokens", ge=0)
    startup_timeout: float = param(600.0, "Seconds to wait for the server to become healthy.",
                                   flag="--sglang-startup-timeout", unit="s", gt=0)
    request_timeout: float = param(600.0, "Seconds before one HTTP request to the server times out.",
                                   flag="--sglang-request-timeout", unit="s", gt=0)


@hookimpl
def relax_register_rollout_engines():
    return [EngineSpec(
        name="sglang",
        summary="SGLang native /generate: tempered log-probs, top-k, routed experts (R3); weights from disk or tensors. GPU only, untested on GPU so far.",
        source="Zheng et al. 2024, SGLang: Efficient Execution of Structured Language Model Programs (NeurIPS'24)",
        factory="relax_sglang.engine:build",
        params=SGLangParams,
        capabilities=lambda p: EngineCapabilities(
            devices=frozenset({"cuda"}),
            provides_fields=frozenset({"rollout_log_probs", "top_k_ids", "top_k_log_probs", "routed_experts"}),
            supports_weight_update=True,
            supports_tensor_parallel=True,
            supports_sampling_penalties=True,
            supports_stop_strings=True,
            supports_token_continuation=True,  # /generate with input_ids
            supports_prefix_caching=True,  # the radix cache
            max_context=p.context_length or None,  # 0: the model's own, unknown before it loads
        ),
    )]
