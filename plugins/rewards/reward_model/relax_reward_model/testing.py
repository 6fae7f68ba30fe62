"""A tiny randomly initialised reward model for tests (no download)."""

from __future__ import annotations

from pathlib import Path


def tiny_reward_model(path: str | Path, seed: int = 0) -> str:
    """Write a 1-layer ``Qwen3ForSequenceClassification`` (``num_labels`` 1, hidden size 32)
    with relax_core's byte tokenizer to ``path``; returns ``path`` as a string."""
    import torch
    from transformers import Qwen3Config, Qwen3ForSequenceClassification

    from relax_authoring.testing.models import byte_tokenizer

    tok = byte_tokenizer()
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, intermediate_size=64, num_labels=1,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)
    Qwen3ForSequenceClassification(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)
