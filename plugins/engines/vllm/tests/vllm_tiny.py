"""A random tiny Llama for the vLLM tests: head_dim 64 (vLLM's CPU attention refuses 16),
SmolLM2's tokenizer (with its chat template), float32 safetensors."""

from __future__ import annotations

from pathlib import Path


def make_tiny_llama(out: Path, seed: int = 0) -> Path:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    from relax_core.models import ensure_default_model

    tok = AutoTokenizer.from_pretrained(ensure_default_model())
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # a peaked, non-uniform distribution (random init is near-uniform)
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p) if p.dim() > 1 else 0.05 * torch.randn_like(p))
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                               pad_token_id=tok.pad_token_id)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
