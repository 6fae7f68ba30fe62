"""Hugging Face Llama/Qwen-family ⇄ Megatron-core ``GPTModel``: config and weights.

Supported ``model_type``: ``llama``, ``mistral`` (no sliding window), ``qwen2`` (q/k/v
bias), ``qwen3`` (q/k RMSNorm).  Dense models only; RoPE scaling other than the default
is refused.

Weight layout (Megatron-core, local spec, tensor-parallel size ``tp``, rank ``r``):

=====================================================  ==============================================
Megatron name                                          from Hugging Face
=====================================================  ==============================================
``embedding.word_embeddings.weight`` [V/tp, H]          ``model.embed_tokens.weight`` rows of rank r
``decoder.layers.i.input_layernorm.weight`` [H]         ``model.layers.i.input_layernorm.weight``
``decoder.layers.i.self_attention.linear_qkv.weight``   q/k/v_proj, interleaved per query group:
  [(g/tp)·(n/g + 2)·d, H]                                 for each KV group ``[q heads of the group; k; v]``
``...linear_qkv.bias`` (qwen2)                          q/k/v_proj biases, same interleaving
``...self_attention.q_layernorm.weight`` [d] (qwen3)    ``self_attn.q_norm.weight`` (k likewise)
``...self_attention.linear_proj.weight`` [H, n·d/tp]    ``o_proj.weight`` columns of rank r
``decoder.layers.i.pre_mlp_layernorm.weight`` [H]       ``post_attention_layernorm.weight``
``...mlp.linear_fc1.weight`` [2F/tp, H]                 ``[gate_proj rows of r; up_proj rows of r]``
``...mlp.linear_fc2.weight`` [H, F/tp]                  ``down_proj.weight`` columns of rank r
``decoder.final_layernorm.weight`` [H]                  ``model.norm.weight``
``output_layer.weight`` [V/tp, H] (untied only)         ``lm_head.weight`` rows of rank r
=====================================================  ==============================================

``n`` query heads, ``g`` KV groups, ``d`` head dim, ``F`` MLP width.  With pipeline
parallelism (``PP`` stages, stage ``p``) a stage holds HF layers ``[p·L/PP, (p+1)·L/PP)``
under local indices ``decoder.layers.0…``; the embedding is on the first stage, the final
norm and ``output_layer`` on the last (with tied embeddings and ``PP > 1`` the last stage
holds a copy of the embedding as ``output_layer.weight``).  Hugging Face's
``repeat_kv`` gives query head ``h`` the KV head ``h // (n/g)``, which is exactly
Megatron's grouping, and both apply RoPE with the non-interleaved ``rotate_half`` form.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class ArchSpec:
    """The Hugging Face config values the conversion needs."""

    model_type: str
    vocab_size: int
    hidden_size: int
    ffn_hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_layernorm: bool


def arch_from_hf_config(c: Any) -> ArchSpec:
    """Read an ``ArchSpec`` from a transformers ``PretrainedConfig``.

    Raises:
        ValueError: unsupported ``model_type``, activation, RoPE scaling, sliding window,
            MoE or MLP bias.
    """
    mt = c.model_type
    if mt not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"megatron backend supports model types {SUPPORTED_MODEL_TYPES}, not {mt!r}")
    if getattr(c, "hidden_act", "silu") != "silu":
        raise ValueError(f"only SwiGLU (hidden_act='silu') MLPs are supported, got {c.hidden_act!r}")
    rope = dict(getattr(c, "rope_parameters", None) or {})
    legacy = getattr(c, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", legacy.get("rope_type", legacy.get("type", "default")))
    if rope_type not in (None, "default"):
        raise ValueError(f"RoPE scaling {rope_type!r} is not supported by the conversion")
    theta = rope.get("rope_theta", getattr(c, "rope_theta", None))
    if theta is None:
        raise ValueError("the config has no rope_theta")
    if getattr(c, "use_sliding_window", False) or (mt == "mistral" and getattr(c, "sliding_window", None)):
        raise ValueError("sliding-window attention is not supported")
    if any(int(getattr(c, k, 0) or 0) > 1 for k in ("num_experts", "num_local_experts")):
        raise ValueError("mixture-of-experts models are not supported by the conversion yet")
    if getattr(c, "mlp_bias", False):
        raise ValueError("MLP biases are not supported")
    heads = c.num_attention_heads
    return ArchSpec(
        model_type=mt,
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        ffn_hidden_size=c.intermediate_size,
        num_layers=c.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
        rms_norm_eps=c.rms_norm_eps,
        rope_theta=float(theta),
        max_position_embeddings=c.max_position_embeddings,
        tie_word_embeddings=bool(c.tie_word_embeddings),
        qkv_bias=mt == "qwen2" or bool(getattr(c, "attention_bias", False)),
        qk_layernorm=mt == "qwen3",
    )


def check_tp(a: ArchSpec, tp: int) -> None:
    """Raise ``ValueError`` unless heads, KV groups, MLP width and vocab split over ``tp``."""
    for what, n in (("num_attention_heads", a.num_heads), ("num_key_value_heads", a.num_kv_heads),
                    ("intermediate_size", a.ffn_hidden_size), ("vocab_size", a.vocab_size)):
        if n % tp:
            raise ValueError(f"{what} = {n} is not divisible by --tensor-parallel-size {tp}")


def check_pp(a: ArchSpec, pp: int) -> None:
    """Raise ``ValueError`` unless the layers split evenly over ``pp`` pipeline stages."""
    if a.num_layers % pp:
        raise ValueError(f"num_hidden_layers = {a.num_layers} is not divisible by --pipeline-parallel-size {pp}")


def build_gpt_model(a: ArchSpec, *, sequence_length: int | None = None,
                    pipeline_dtype: torch.dtype = torch.float32) -> Any:
    """This rank's Megatron-core ``GPTModel`` (float32 weights) for ``a``: its pipeline stage
    (``pre_process`` on the first, ``post_process`` on the last) of its tensor-parallel shard.

    Local spec (no Transformer Engine), except the core attention with context parallelism
    > 1: Transformer Engine's ``TEDotProductAttention``, the only attention of megatron-core
    0.16.1 that supports it (its local ``DotProductAttention`` asserts
    ``context_parallel_size == 1``); the weights keep the local spec's names.

    Must be called after ``parallel_state.initialize_model_parallel``; the weights are
    random (``perform_initialization=False``) until :func:`load_hf_state_dict`.
    Dropout is 0 (RL fine-tuning convention, and makes forward deterministic).
    ``pipeline_dtype``: the dtype of the hidden states pipeline stages exchange (that of a
    layer's output: bfloat16 under ``--bf16`` autocast).  ``calculate_per_token_loss`` makes megatron's pipeline schedule backpropagate each
    micro-batch's loss unscaled (the backend's losses carry the global denominators).
    """
    import torch.nn.functional as F
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    cuda = torch.cuda.is_available()
    pp, cp = ps.get_pipeline_model_parallel_world_size(), ps.get_context_parallel_world_size()

    cfg = TransformerConfig(
        num_layers=a.num_layers,
        hidden_size=a.hidden_size,
        ffn_hidden_size=a.ffn_hidden_size,
        num_attention_heads=a.num_heads,
        num_query_groups=a.num_kv_heads,
        kv_channels=a.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=a.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=a.qkv_bias,
        qk_layernorm=a.qk_layernorm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=_tp_size(),
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
        pipeline_dtype=pipeline_dtype,
        batch_p2p_comm=cuda,  # its batch_p2p_sync calls torch.cuda.synchronize
        calculate_per_token_loss=True,
        params_dtype=torch.float32,
        perform_initialization=False,
        use_cpu_initialization=not cuda,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
    )
    spec = get_gpt_layer_local_spec(qk_layernorm=a.qk_layernorm, normalization="RMSNorm")
    if cp > 1:
        from megatron.core.extensions.transformer_engine import TEDotProductAttention

        spec.submodules.self_attention.submodules.core_attention = TEDotProductAttention
    from relax_megatron.shim import cuda_on_cpu

    # on CPU: with tied embeddings and PP > 1, GPTModel moves the last stage's copy to .cuda()
    with contextlib.nullcontext() if cuda else cuda_on_cpu():
        return GPTModel(
            config=cfg,
            transformer_layer_spec=spec,
            vocab_size=a.vocab_size,
            max_sequence_length=sequence_length or a.max_position_embeddings,
            share_embeddings_and_output_weights=a.tie_word_embeddings,
            position_embedding_type="rope",
            rotary_base=int(a.rope_theta),
            parallel_output=True,
            pre_process=ps.is_pipeline_first_stage(),
            post_process=ps.is_pipeline_last_stage(),
        )


def _tp_size() -> int:
    from megatron.core import parallel_state as ps

    return ps.get_tensor_model_parallel_world_size()


def _qkv_full(q: Tensor, k: Tensor, v: Tensor, a: ArchSpec) -> Tensor:
    """Interleave q/k/v (weights ``[*, H]`` or biases ``[*]``) per KV group → Megatron order."""
    g, d, hpg = a.num_kv_heads, a.head_dim, a.num_heads // a.num_kv_heads
    tail = q.shape[1:]
    q = q.reshape(g, hpg * d, *tail)
    k = k.reshape(g, d, *tail)
    v = v.reshape(g, d, *tail)
    return torch.cat([q, k, v], dim=1).reshape(g * (hpg + 2) * d, *tail)


def _qkv_split(w: Tensor, a: ArchSpec) -> tuple[Tensor, Tensor, Tensor]:
    """Inverse of :func:`_qkv_full`."""
    g, d, hpg = a.num_kv_heads, a.head_dim, a.num_heads // a.num_kv_heads
    tail = w.shape[1:]
    w = w.reshape(g, (hpg + 2) * d, *tail)
    q, k, v = w.split([hpg * d, d, d], dim=1)
    return q.reshape(g * hpg * d, *tail), k.reshape(g * d, *tail), v.reshape(g * d, *tail)


def hf_to_megatron(hf: dict[str, Tensor], a: ArchSpec, tp: int = 1, rank: int = 0, *, pp: int = 1,
                   pp_rank: int = 0) -> dict[str, Tensor]:
    """Megatron state dict of TP rank ``rank`` (of ``tp``) of pipeline stage ``pp_rank`` (of
    ``pp``) from a full HF state dict (layer names local to the stage).

    Raises:
        KeyError: a tensor the architecture needs is missing from ``hf``.
        ValueError: the sizes do not divide the model (:func:`check_tp`, :func:`check_pp`).
    """
    check_tp(a, tp)
    check_pp(a, pp)
    return stage_of(_hf_to_megatron(hf, a, tp, rank), a, pp, pp_rank)


def stage_of(sd: dict[str, Tensor], a: ArchSpec, pp: int, pp_rank: int) -> dict[str, Tensor]:
    """The tensors of pipeline stage ``pp_rank`` (of ``pp``) of a whole-model Megatron state
    dict, decoder layers renumbered from 0 (see the module docstring)."""
    if pp == 1:
        return sd
    per = a.num_layers // pp
    first, last = pp_rank == 0, pp_rank == pp - 1
    out = {}
    for k, v in sd.items():
        if k.startswith("decoder.layers."):
            i, rest = k.removeprefix("decoder.layers.").split(".", 1)
            if pp_rank * per <= int(i) < (pp_rank + 1) * per:
                out[f"decoder.layers.{int(i) - pp_rank * per}.{rest}"] = v
        elif (first if k.startswith("embedding.") else last):
            out[k] = v
    if last and not first and a.tie_word_embeddings:
        out["output_layer.weight"] = sd["embedding.word_embeddings.weight"]
    return out


def merge_stages(stages: list[dict[str, Tensor]], a: ArchSpec) -> dict[str, Tensor]:
    """Inverse of :func:`stage_of`: the whole-model state dict from every stage's (in stage
    order); the last stage's copy of tied embeddings is dropped."""
    pp = len(stages)
    if pp == 1:
        return stages[0]
    per = a.num_layers // pp
    out = {}
    for p, sd in enumerate(stages):
        for k, v in sd.items():
            if k.startswith("decoder.layers."):
                i, rest = k.removeprefix("decoder.layers.").split(".", 1)
                out[f"decoder.layers.{int(i) + p * per}.{rest}"] = v
            elif not (k == "output_layer.weight" and a.tie_word_embeddings):
                out[k] = v
    return out


def _hf_to_megatron(hf: dict[str, Tensor], a: ArchSpec, tp: int, rank: int) -> dict[str, Tensor]:

    def rows(t: Tensor) -> Tensor:
        return t.chunk(tp, dim=0)[rank]

    def cols(t: Tensor) -> Tensor:
        return t.chunk(tp, dim=1)[rank]

    out = {"embedding.word_embeddings.weight": rows(hf["model.embed_tokens.weight"]),
           "decoder.final_layernorm.weight": hf["model.norm.weight"]}
    if not a.tie_word_embeddings:
        out["output_layer.weight"] = rows(hf["lm_head.weight"])
    for i in range(a.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        att = h + "self_attn."
        out[m + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"]
        out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
        out[m + "self_attention.linear_qkv.weight"] = rows(_qkv_full(
            hf[att + "q_proj.weight"], hf[att + "k_proj.weight"], hf[att + "v_proj.weight"], a))
        if a.qkv_bias:
            out[m + "self_attention.linear_qkv.bias"] = rows(_qkv_full(
                hf[att + "q_proj.bias"], hf[att + "k_proj.bias"], hf[att + "v_proj.bias"], a))
        if a.qk_layernorm:
            out[m + "self_attention.q_layernorm.weight"] = hf[att + "q_norm.weight"]
            out[m + "self_attention.k_layernorm.weight"] = hf[att + "k_norm.weight"]
        out[m + "self_attention.linear_proj.weight"] = cols(hf[att + "o_proj.weight"])
        out[m + "mlp.linear_fc1.weight"] = torch.cat(
            [rows(hf[h + "mlp.gate_proj.weight"]), rows(hf[h + "mlp.up_proj.weight"])], dim=0)
        out[m + "mlp.linear_fc2.weight"] = cols(hf[h + "mlp.down_proj.weight"])
    return out


def megatron_to_hf(shards: list[dict[str, Tensor]], a: ArchSpec) -> dict[str, Tensor]:
    """Full HF state dict from the whole-model Megatron state dicts of all TP ranks (in rank
    order; with pipeline parallelism each merged over the stages by :func:`merge_stages`).

    Inverse of :func:`hf_to_megatron`; with tied embeddings ``lm_head.weight`` is omitted
    (Hugging Face ties it to ``model.embed_tokens.weight``).
    """

    def rows(name: str) -> Tensor:
        return torch.cat([s[name] for s in shards], dim=0)

    def cols(name: str) -> Tensor:
        return torch.cat([s[name] for s in shards], dim=1)

    s0 = shards[0]
    out = {"model.embed_tokens.weight": rows("embedding.word_embeddings.weight"),
           "model.norm.weight": s0["decoder.final_layernorm.weight"]}
    if not a.tie_word_embeddings:
        out["lm_head.weight"] = rows("output_layer.weight")
    for i in range(a.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        att = h + "self_attn."
        out[h + "input_layernorm.weight"] = s0[m + "input_layernorm.weight"]
        out[h + "post_attention_layernorm.weight"] = s0[m + "pre_mlp_layernorm.weight"]
        q, k, v = _qkv_split(rows(m + "self_attention.linear_qkv.weight"), a)
        out[att + "q_proj.weight"], out[att + "k_proj.weight"], out[att + "v_proj.weight"] = q, k, v
        if a.qkv_bias:
            q, k, v = _qkv_split(rows(m + "self_attention.linear_qkv.bias"), a)
            out[att + "q_proj.bias"], out[att + "k_proj.bias"], out[att + "v_proj.bias"] = q, k, v
        if a.qk_layernorm:
            out[att + "q_norm.weight"] = s0[m + "self_attention.q_layernorm.weight"]
            out[att + "k_norm.weight"] = s0[m + "self_attention.k_layernorm.weight"]
        out[att + "o_proj.weight"] = cols(m + "self_attention.linear_proj.weight")
        gate_up = [s[m + "mlp.linear_fc1.weight"].chunk(2, dim=0) for s in shards]
        out[h + "mlp.gate_proj.weight"] = torch.cat([g for g, _ in gate_up], dim=0)
        out[h + "mlp.up_proj.weight"] = torch.cat([u for _, u in gate_up], dim=0)
        out[h + "mlp.down_proj.weight"] = cols(m + "mlp.linear_fc2.weight")
    return out


def load_hf_state_dict(model: Any, hf: dict[str, Tensor], a: ArchSpec) -> None:
    """Copy a full HF state dict into this rank's ``GPTModel`` (its TP shard of its pipeline
    stage; strict: every
    parameter is set, no tensor left over)."""
    from megatron.core import parallel_state as ps

    sd = hf_to_megatron(hf, a, ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank(),
                        pp=ps.get_pipeline_model_parallel_world_size(), pp_rank=ps.get_pipeline_model_parallel_rank())
    own = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    missing, extra = sorted(set(own) - set(sd)), sorted(set(sd) - set(own))
    if missing or extra:
        raise KeyError(f"weight conversion mismatch: missing {missing}, unexpected {extra}")
    with torch.no_grad():
        for k, t in own.items():
            if t.shape != sd[k].shape:
                raise ValueError(f"{k}: Megatron shape {tuple(t.shape)} != converted {tuple(sd[k].shape)}")
            t.copy_(sd[k])


def local_state_dict(model: Any) -> dict[str, Tensor]:
    """This rank's Megatron tensors (detached, on CPU), without ``_extra_state`` entries."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
