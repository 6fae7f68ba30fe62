"""Hook implementations of relax-hf (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import EngineCapabilities, EngineSpec, hookimpl, param


@dataclass(frozen=True)
class HFEngineParams:
    dtype: str = param("auto", "Weights and compute dtype of the rollout model; auto: bfloat16 when the run trains "
                       "with --bf16 (on by default where the device computes bfloat16 natively), else float32.",
                       flag="--hf-dtype", choices=("auto", "float32", "bfloat16", "float16"))
    max_batch_size: int = param(64, "Most sequences decoded together (larger batches run in chunks).",
                                flag="--hf-max-batch-size", ge=1)


@hookimpl
def relax_register_rollout_engines():
    return [EngineSpec(
        name="hf",
        summary="Hugging Face transformers: batched KV-cache sampling with log-probs of the sampling distribution.",
        source="transformers (Wolf et al. 2020); sampling warpers: Holtzman et al. 2020 (top-p), "
               "Keskar et al. 2019 (repetition penalty)",
        factory="relax_hf.engine:build",
        params=HFEngineParams,
        capabilities=EngineCapabilities(
            devices=frozenset({"cpu", "cuda"}),
            provides_fields=frozenset({"rollout_log_probs", "top_k_ids", "top_k_log_probs", "routed_experts"}),
            supports_weight_update=True,
            supports_shared_weights=True,
            supports_sampling_penalties=True,
            supports_stop_strings=True,
            supports_token_continuation=True,  # generate() takes any token-id prompt as given
        ),
    )]
