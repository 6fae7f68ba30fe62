"""Activation checkpointing of the decoder layers: selective (``--selective-checkpointing``,
the default) or full (``--gradient-checkpointing``).

Autograd keeps, for the backward, what each operation of the forward needs: for SmolLM2-135M
at the default step (one micro-batch of about 1 000 positions, float32) about 1.4 GiB, half of
it the element-wise tensors of the MLP (``down(silu(gate(x)) · up(x))`` keeps ``gate(x)``,
``silu(gate(x))``, ``up(x)`` and their product) and of the float32 RMSNorms.  Both modes go
through transformers' ``gradient_checkpointing_enable``, which runs each decoder layer under
``torch.utils.checkpoint.checkpoint`` (non-reentrant):

- **selective**: PyTorch's selective activation checkpoint
  (``torch.utils.checkpoint.create_selective_checkpoint_contexts``; PyTorch docs,
  "torch.utils.checkpoint"): the outputs of the matrix products and attention kernels
  (:data:`SAVED_OPS`) are kept from the forward and every other operation of the layer (norms,
  SiLU and the gate product, rotary embedding, the KV repeat, casts, residual adds) runs again
  in the backward, from them.  Those are element-wise, so their second run costs little next
  to the products it does not repeat.  It repeats the same kernels on the same inputs, so the
  gradients are those without it; in float32 and float64 on CPU bit for bit (tested; on CUDA
  only where the kernels are deterministic, ``torch.use_deterministic_algorithms``; under
  bfloat16 autocast not always bit for bit: ``docs/guide/performance.md``).  Measured
  on one default step of SmolLM2 (float32): its peak above the RSS before it falls from
  1.93–1.99 to 1.22–1.50 GiB; a whole default run's training step takes about 4 % longer
  (``benchmarks/results/memory-20261206.md``).  Not for a model trained through LoRA adapters:
  their frozen base products keep nothing for the backward, so keeping their outputs holds
  about as much as it frees (the backend leaves it off there).
- **full**: only each layer's input is kept and the whole layer, products included, runs again
  in the backward (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost", arXiv
  1604.06174): less memory (0.86–1.00 GiB there), 10–20 % more time per step.

Forwards without gradient (old and reference log-probs, the teacher) are not checkpointed:
``checkpoint`` runs the layer plainly when grad is off.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_aten = torch.ops.aten
#: Operations whose outputs selective checkpointing keeps: matrix products (``nn.Linear``
#: dispatches to ``mm``/``addmm``; batched and grouped products for attention and experts)
#: and the fused attention kernels of each device (the ones this PyTorch build has).
SAVED_OPS = frozenset(
    getattr(_aten, name).default
    for name in ("mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "_scaled_mm",
                 "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
    if hasattr(_aten, name)
)


def _policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def checkpoint_layers(model: Any, *, full: bool, selective: bool) -> str | None:
    """Turn on activation checkpointing of ``model``'s decoder layers.

    Args:
        model: a transformers ``PreTrainedModel`` (the base model under a peft adapter).
        full: recompute whole layers (``--gradient-checkpointing``); takes precedence.
        selective: keep the outputs of :data:`SAVED_OPS`, recompute the rest.

    Returns:
        ``"full"``, ``"selective"`` or None (neither asked for, or selective asked for on a
        model class that transformers cannot checkpoint: then with a warning).

    Raises:
        ValueError: ``full`` on a model class that transformers cannot checkpoint
            (transformers' own error).
    """
    if full:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return "full"
    if not selective:
        return None
    if not getattr(model, "supports_gradient_checkpointing", False):
        warnings.warn(f"torch backend: --selective-checkpointing off ({type(model).__name__} cannot be checkpointed "
                      "by transformers); --no-selective-checkpointing silences this", stacklevel=3)
        return None
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={
        "use_reentrant": False, "context_fn": functools.partial(create_selective_checkpoint_contexts, _policy)})
    return "selective"
