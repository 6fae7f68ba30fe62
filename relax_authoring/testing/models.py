"""Tiny random Hugging Face models for tests and benchmarks: a byte-level tokenizer built in
place and random Qwen3 / Qwen3-MoE model directories of any size (:data:`QWEN3_0_6B` for the
real shape).  Heavy imports happen inside the functions."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from relax_core.models import ensure_default_model

#: The architecture of Qwen3-0.6B (Qwen/Qwen3-0.6B's ``config.json`` on the Hugging Face hub,
#: https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json): 28 layers, hidden 1024,
#: 16 query / 8 key-value heads of 128, MLP 3072, vocabulary 151936, tied embeddings; about
#: 0.6 B parameters (0.44 B without the embedding).  For ``make_tiny_model(config=...)``:
#: a random model of the real shape, for speed and memory measurements (weights do not
#: change them).
QWEN3_0_6B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)

#: ChatML, the chat format of Qwen's tokenizers, for :func:`byte_tokenizer`.
_CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def byte_tokenizer() -> Any:
    """A byte-level tokenizer built in place (no download, no model package): the 256 byte
    symbols of GPT-2's byte-level alphabet (Radford et al. 2019) with no merges, so every
    UTF-8 byte is one token, plus ``<|im_end|>`` (EOS, id 256), ``<|endoftext|>`` (pad, 257)
    and ``<|im_start|>`` (258), and a ChatML chat template.  259 tokens; decoding skips ids
    past them (a random model of a larger vocabulary samples those).

    Returns:
        a ``transformers`` fast tokenizer (``save_pretrained`` writes a normal directory).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = _CHATML
    return fast


def make_tiny_model(path: str | os.PathLike, *, moe: bool = False, seed: int = 0,
                    vocab_from: str = "smollm2", num_layers: int = 2, hidden_size: int = 64,
                    config: dict[str, Any] | None = None) -> Path:
    """Write a random tiny Qwen3 (or Qwen3-MoE) Hugging Face model directory for tests.

    The tokenizer is a real one with a chat template (SmolLM2's, vocabulary 49152, taken
    from the converted default model, so the first call pays the one-off conversion; or
    :func:`byte_tokenizer`'s 259 tokens, which needs no model package), and the config's
    bos/eos/pad ids follow it.  Dense: ``num_layers`` layers, hidden 64,
    4 heads (2 KV heads, head_dim 16), tied embeddings.  MoE: the same with 4 experts,
    top-2 routing in every layer.  Weights are float32 safetensors, deterministic in ``seed``.

    Args:
        path: output directory (created).
        moe: Qwen3-MoE instead of dense Qwen3.
        seed: weight initialisation seed.
        vocab_from: ``"smollm2"``, ``"bytes"`` (:func:`byte_tokenizer`) or a local HF
            directory whose tokenizer to reuse.
        config: Qwen3 config values that replace the tiny ones (e.g. :data:`QWEN3_0_6B`
            for a random model of the real size; its ``vocab_size`` may exceed the
            tokenizer's).

    Returns:
        ``Path(path)``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    if vocab_from == "bytes":
        tok = byte_tokenizer()
    else:
        tok = AutoTokenizer.from_pretrained(ensure_default_model() if vocab_from == "smollm2" else Path(vocab_from))
    common = dict(vocab_size=len(tok), hidden_size=hidden_size, num_hidden_layers=num_layers,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                  tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                  pad_token_id=tok.pad_token_id, rms_norm_eps=1e-6, intermediate_size=128)
    common.update(config or {})
    if common["vocab_size"] < len(tok):
        raise ValueError(f"config vocab_size {common['vocab_size']} < the tokenizer's {len(tok)} tokens")
    if moe:
        from transformers import Qwen3MoeConfig

        hf_config = Qwen3MoeConfig(moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                                   decoder_sparse_step=1, norm_topk_prob=True, mlp_only_layers=[], **common)
    else:
        from transformers import Qwen3Config

        hf_config = Qwen3Config(**common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    out = Path(path)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def noisy_copy(src: str | os.PathLike, dst: str | os.PathLike, sigma: float, seed: int = 0) -> Path:
    """Write a copy of the model directory ``src`` to ``dst`` with N(0, sigma²) noise added to
    every weight matrix (parameters of two or more dimensions; norms and biases unchanged),
    deterministic in ``seed``, and ``src``'s tokenizer: a student (or a teacher) that
    disagrees with ``src`` by a known amount, for distillation tests.

    Returns:
        ``Path(dst)``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.add_(torch.randn(p.shape, generator=g) * sigma)
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return Path(dst)
