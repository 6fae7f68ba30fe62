"""Hook implementations of relax-torch (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import BackendCapabilities, BackendSpec, hookimpl, param

#: The LoRA target modules by Hugging Face ``model_type`` (the capability
#: ``lora_default_targets``; :mod:`relax_torch.lora`): projections of the decoder's attention
#: and MLP blocks.  Dense models: every attention and MLP projection (Hu et al. §7.1 adapt
#: attention only; QLoRA, Dettmers et al. 2023, arXiv 2305.14314 §4, finds all linear layers
#: needed to match full fine-tuning).
#: Mixture-of-experts models: the attention projections only (the experts are fused 3-D
#: parameters in transformers 5, not linear layers; the router is left alone so routing
#: stays the base model's).
_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_DENSE = (*_ATTENTION, "gate_proj", "up_proj", "down_proj")
DEFAULT_TARGET_MODULES: dict[str, tuple[str, ...]] = {
    "llama": _DENSE,  # SmolLM2 (the default model)
    "qwen2": _DENSE,
    "qwen3": _DENSE,
    "qwen3_moe": _ATTENTION,
}
#: Modules an adapter may not target (the capability ``lora_excluded_modules``): the
#: log-probs are computed from the output embedding's weight directly (chunked
#: log-softmax, :mod:`relax_torch.logprobs`), and it is tied to the input embedding.
EMBEDDINGS = frozenset({"lm_head", "embed_tokens"})


@dataclass(frozen=True)
class TorchBackendParams:
    dtype: str = param("float32", "Master weight dtype (float64 for numerical checks; --bf16 adds bfloat16 autocast).",
                       flag="--torch-dtype", choices=("float32", "float64"))
    logits_chunk_size: int = param(512, "Tokens per chunk of the full-vocabulary log-softmax (memory ~ chunk × vocab).",
                                   flag="--torch-logits-chunk-size", unit="tokens", ge=1)
    adam_beta1: float = param(0.9, "AdamW β1.", flag="--adam-beta1", ge=0, lt=1)
    adam_beta2: float = param(0.999, "AdamW β2.", flag="--adam-beta2", ge=0, lt=1)
    adam_eps: float = param(1e-8, "AdamW ε.", flag="--adam-eps", gt=0)
    shared_prefix: bool = param(
        True, "Shared-prefix training forward (Prefix Grouper, arXiv 2506.05433): one row per prompt group, "
              "the prompt encoded once and each response attending to it through a 4-D mask; exact (same "
              "log-probs and gradients), so on by default; where it cannot be exact (attention other than "
              "eager/sdpa, sliding window, routing replay) the plain layout is used, with a warning.",
        flag="--shared-prefix")
    packing: bool = param(
        True, "With --max-tokens-per-micro-batch: each micro-batch is one row of whole sequences (prompt "
              "groups with --shared-prefix) packed end to end without padding, up to that many real tokens, "
              "behind a block-diagonal 4-D mask with per-sequence position ids; exact, on by default under "
              "the same conditions as --shared-prefix (--no-packing: the budget counts padded positions).",
        flag="--packing")
    selective_checkpointing: bool = param(
        True, "Selective activation checkpointing: the backward keeps the outputs of the matrix products and "
              "attention and recomputes the decoder layers' element-wise operations (norms, activations, "
              "rotary embedding) from them: the same gradients (bit for bit in float32), about a third less "
              "activation memory for about 4 % more training time, so on by default; not under LoRA (no "
              "saving there); --gradient-checkpointing (everything recomputed) takes precedence.",
        flag="--selective-checkpointing")


@hookimpl
def relax_register_train_backends():
    return [BackendSpec(
        name="torch",
        summary="Plain PyTorch: actor, frozen reference and critic; AdamW, micro-batches, gradient accumulation, "
                "data parallel over torch.distributed; LoRA adapters (peft).",
        source="AdamW: Loshchilov & Hutter 2019; PPO actor/critic: Schulman et al. 2017; LoRA: Hu et al. 2021, arXiv 2106.09685",
        factory="relax_torch.backend:build",
        params=TorchBackendParams,
        capabilities=BackendCapabilities(
            devices=frozenset({"cpu", "cuda"}),
            supports_data_parallel=True,
            supports_critic=True,
            supports_routing_replay=True,
            provides_fields=frozenset({"train_top_k_log_probs", "teacher_log_probs"}),
            supports_token_budget=True,
            supports_gradient_checkpointing=True,
            bf16_devices=frozenset({"cpu", "cuda"}),
            supports_shared_prefix=True,
            supports_lora=True,
            lora_default_targets=DEFAULT_TARGET_MODULES,
            lora_excluded_modules=EMBEDDINGS,
        ),
    )]
