"""LoRA adapters for the torch backend, built on ``peft`` (``--lora-rank > 0``).

Each adapted linear layer computes ``h = W x + (α/r) · B A x`` with ``W`` frozen, ``A``
``[r, d_in]`` (Kaiming-uniform) and ``B`` ``[d_out, r]`` (zero), so the model starts as the
base model (Hu et al. 2021, arXiv 2106.09685, eq. 3 and §4.1).  ``peft`` injects the layers
into the Hugging Face model in place: the model keeps its type and attributes
(``base_model``, ``get_output_embeddings``), every non-adapter parameter is frozen
(``requires_grad=False``), and its ``state_dict`` names gain ``.base_layer.`` and
``.lora_A.default.`` / ``.lora_B.default.`` parts.  What leaves the backend does not:

- :func:`merged_state_dict`: the base model's names, each adapted weight replaced by
  ``W + (α/r) · B A`` (peft's ``get_delta_weight``), for engines that load a full state dict;
- :func:`engine_adapter`: the adapter in PEFT's format, for engines that take adapters;
- :func:`adapter_state_dict`: the trainable (adapter) tensors only, for checkpoints.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from torch import Tensor, nn

from relax_core.contracts import AdapterWeights
from relax_torch.plugin import DEFAULT_TARGET_MODULES, EMBEDDINGS

ADAPTER = "default"  # peft's adapter name

def target_modules(cfg: Any, model_type: str | None) -> tuple[str, ...]:
    """``--lora-target-modules``, or the default of ``model_type`` (:data:`DEFAULT_TARGET_MODULES`).

    Raises:
        ValueError: no modules given and no default for this architecture (startup
            validation refuses it first where the model type can be read from config.json).
    """
    if cfg.lora_target_modules:
        return tuple(cfg.lora_target_modules)
    if model_type not in DEFAULT_TARGET_MODULES:
        raise ValueError(f"--lora-rank: no default --lora-target-modules for model type {model_type!r} "
                         f"(defaults exist for {', '.join(sorted(DEFAULT_TARGET_MODULES))}); "
                         "name the linear layers to adapt, e.g. --lora-target-modules q_proj --lora-target-modules v_proj")
    return DEFAULT_TARGET_MODULES[model_type]


def add_adapter(model: nn.Module, cfg: Any) -> Any:
    """Inject LoRA layers into ``model`` in place (``--lora-rank``, ``--lora-alpha``,
    ``--lora-dropout``, ``--lora-target-modules`` or the architecture's default) and freeze
    every other parameter.

    Returns:
        the ``peft.PeftModel`` wrapping ``model`` (``disable_adapter()``, ``save_pretrained``).

    Raises:
        ValueError: no default target modules for the architecture, a target module that
            matches no layer, or an adapter on the input or output embedding.
    """
    from peft import LoraConfig, get_peft_model

    modules = target_modules(cfg, getattr(model.config, "model_type", None))
    config = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                        target_modules=list(modules), bias="none")
    peft_model = get_peft_model(model, config)  # raises ValueError when a target matches nothing
    embeddings = {id(model.get_input_embeddings()), id(model.get_output_embeddings())}
    hit = [n for n, m in model.named_modules() if hasattr(m, "lora_A") and
           (id(m) in embeddings or id(getattr(m, "base_layer", None)) in embeddings or n.split(".")[-1] in EMBEDDINGS)]
    if hit:
        raise ValueError(f"--lora-target-modules adapts the embeddings ({', '.join(hit)}): the log-probs read the "
                         "output embedding's weight directly, so target linear layers of the decoder blocks")
    return peft_model


def _lora_layers(model: nn.Module) -> dict[str, Any]:
    from peft.tuners.lora import LoraLayer

    return {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer)}


def merged_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The adapted model's weights as the base model's state dict: the same names
    (no ``base_layer``, no ``lora_`` entries), each adapted ``weight`` ``W + (α/r) · B A``
    (a new tensor), every other tensor a detached view of the live parameter.

    Returns:
        name -> tensor, in the model's dtype and device.
    """
    layers = _lora_layers(model)
    out: dict[str, Tensor] = {}
    for k, v in model.state_dict().items():
        if ".lora_" in k:
            continue
        out[k.replace(".base_layer.", ".")] = v.detach()
    with torch.no_grad():
        for name, layer in layers.items():
            base = layer.get_base_layer()
            out[f"{name}.weight"] = base.weight.detach() + layer.get_delta_weight(ADAPTER).to(base.weight.dtype)
    return out


def engine_adapter(peft_model: Any) -> AdapterWeights:
    """The adapter as ``peft_model.save_pretrained`` would write it (tensors under PEFT's
    saved names, ``base_model.model.<module>.lora_A.weight``; the config as
    ``adapter_config.json``), in memory: what an engine declaring
    ``supports_lora_adapters`` gets.  The tensors are detached copies on the CPU."""
    from peft import get_peft_model_state_dict

    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in get_peft_model_state_dict(
        peft_model, save_embedding_layers=False).items()}  # no embeddings adapted; no hub lookup per push
    config = peft_model.peft_config[ADAPTER].to_dict()
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}  # JSON, as save_pretrained writes it
    config["inference_mode"] = True  # as save_pretrained writes it
    return AdapterWeights(tensors=tensors, config=json.loads(json.dumps(config, default=str)))


def adapter_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The trainable (adapter) parameters, ``model.named_parameters()`` names -> detached
    contiguous tensors (``lora_A`` ``[r, d_in]``, ``lora_B`` ``[d_out, r]`` per layer)."""
    return {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}


def load_adapter_state_dict_(model: nn.Module, tensors: dict[str, Tensor]) -> None:
    """Copy :func:`adapter_state_dict`'s tensors back into ``model`` in place.

    Raises:
        KeyError: the names are not exactly the model's adapter parameters (another rank,
            other target modules, or a full-model checkpoint).
        ValueError: a shape differs.
    """
    own = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if set(own) != set(tensors):
        extra, missing = sorted(set(tensors) - set(own)), sorted(set(own) - set(tensors))
        raise KeyError(f"checkpoint does not hold this run's LoRA adapter: unknown {extra[:3]}, missing {missing[:3]}")
    with torch.no_grad():
        for n, p in own.items():
            if tuple(p.shape) != tuple(tensors[n].shape):
                raise ValueError(f"{n}: shape {tuple(tensors[n].shape)} != the adapter's {tuple(p.shape)}")
            p.copy_(tensors[n])
