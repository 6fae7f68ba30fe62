"""Hook implementations of relax-megatron (registration only; nothing heavy imported)."""

from relax_core import BackendCapabilities, BackendSpec, hookimpl

INSTALL_HINT = "pip install -e 'plugins/backends/megatron[backend]'  (megatron-core==0.16.1)"


@hookimpl
def relax_register_train_backends():
    return [BackendSpec(
        name="megatron",
        summary="Megatron-core GPTModel built from a HF Llama/Qwen config; HF<->Megatron weights, vocab-parallel log-probs.",
        source="Shoeybi et al. 2019, Megatron-LM (arXiv:1909.08053) §3; megatron-core 0.16.1",
        factory="relax_megatron.backend:build",
        capabilities=BackendCapabilities(
            devices=frozenset({"cpu", "cuda"}),
            supports_data_parallel=False,
            # one training worker per TP rank: `--launcher ray --actor-num-gpus-per-node TP`
            # (startup validation refuses TP > 1 with --launcher local)
            supports_tensor_parallel=True,
            # one training worker per model-parallel rank (TP × CP × PP) under the Ray launcher;
            # PP runs on CPU (gloo, through the shim) and CUDA; CP needs Transformer Engine's
            # attention (megatron-core 0.16.1 has CP only in TEDotProductAttention)
            supports_context_parallel=True,
            supports_pipeline_parallel=True,
            requires=frozenset({"supports_context_parallel:cuda", "supports_context_parallel:transformer_engine"}),
            supports_critic=False,
            supports_routing_replay=False,
            provides_fields=frozenset({"train_top_k_log_probs"}),
            supports_gradient_checkpointing=False,
            # megatron-core's linear layers' backward does not cast under CPU autocast
            # (grad_output bfloat16 @ weight float32 fails): bf16 on CUDA only
            bf16_devices=frozenset({"cuda"}),
            supports_token_budget=False,  # micro-batches of --micro-batch-size samples only
        ),
    )]
