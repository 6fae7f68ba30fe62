"""Context and pipeline parallelism for the Megatron backend.

**Context parallel (CP).**  Each sequence of length ``S`` (padded to a multiple of
``2·CP``) is cut into ``2·CP`` equal chunks and CP rank ``r`` holds chunks ``r`` and
``2·CP − 1 − r`` (:func:`cp_positions`): with causal attention a later chunk costs more,
so pairing an early and a late chunk balances the ranks (Megatron-LM's
``get_batch_on_this_cp_rank``, Korthikanti et al. 2022 / Liu et al. 2023, ring attention).
Each rank runs the model on its ``2·S/(2·CP)`` positions (the attention exchanges keys and
values inside Transformer Engine's ``TEDotProductAttention``), computes the token
statistics (log-probs, entropy, top-k log-probs) of the response tokens whose predicting
position it holds, and :func:`group_sum` gathers them back to the full ``[b, T]`` layout
(each token is held by exactly one rank, the others contribute 0).

Why gather the per-token statistics rather than reduce the loss on local tokens with
global denominators: the per-token loss is not always local — sequence-level estimators
(GSPO's sequence ratio, per-sample means, ``seq-mean-*`` reductions) and corrections need
the whole response of a sample — so every CP rank computes the *same* loss on the full
``[b, T]`` log-probs with the estimator and corrections unchanged.  The backward of
:func:`group_sum` is the identity, so rank ``r`` backpropagates ``∂L/∂log p`` only into the
tokens it computed; the parameter gradient is the sum over CP ranks (all-reduced by the
backend), which equals the CP = 1 gradient.  Only ``[b, T]`` floats cross ranks, never
logits.

**Pipeline parallel (PP).**  Stage ``p`` of ``PP`` holds decoder layers
``[p·L/PP, (p+1)·L/PP)``; the first stage also the embedding, the last the final norm and
output layer.  :func:`run_pipeline` drives megatron-core's non-interleaved 1F1B schedule
(``get_forward_backward_func``) over equal-shape micro-batches; the token statistics and
the run's loss are computed on the last stage (same contract as without PP), and
:func:`broadcast_from_last_stage` gives every stage its results.

On CPU (gloo) the schedule runs under :func:`relax_megatron.shim.cuda_on_cpu`:
megatron-core 0.16.1 allocates its token counter with a hard-wired ``device="cuda"``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor

# ---------------------------------------------------------------------------- context parallel


def padded_length(seq_len: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is ``>= seq_len`` (``seq_len >= 0``)."""
    return -(-seq_len // multiple) * multiple


def cp_positions(seq_len: int, cp: int, rank: int) -> Tensor:
    """Sequence positions held by context-parallel rank ``rank`` of ``cp``.

    The sequence is cut into ``2·cp`` chunks of ``c = seq_len / (2·cp)`` positions; the
    rank holds chunk ``rank`` then chunk ``2·cp − 1 − rank`` (Megatron-LM's load-balanced
    order).  E.g. ``seq_len=8, cp=2``: rank 0 → ``[0, 1, 6, 7]``, rank 1 → ``[2, 3, 4, 5]``.

    Returns:
        long ``[seq_len / cp]``, increasing.

    Raises:
        ValueError: ``seq_len`` is not a multiple of ``2·cp``, or ``rank`` not in ``[0, cp)``.
    """
    if cp < 1 or not 0 <= rank < cp:
        raise ValueError(f"context-parallel rank {rank} is not in [0, {cp})")
    if seq_len % (2 * cp):
        raise ValueError(f"sequence length {seq_len} is not a multiple of 2 × context-parallel size = {2 * cp}")
    c = seq_len // (2 * cp)
    return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)])


def cp_split(x: Tensor, cp: int, rank: int, dim: int = 1) -> Tensor:
    """This rank's positions of ``x`` along ``dim`` (the sequence dimension), in the order of
    :func:`cp_positions`: ``[..., S, ...] → [..., S/cp, ...]``."""
    return x.index_select(dim, cp_positions(x.shape[dim], cp, rank).to(x.device))


def local_index(at: Tensor, positions: Tensor, seq_len: int) -> tuple[Tensor, Tensor]:
    """Where each global position of ``at`` lies among this rank's ``positions``.

    Args:
        at: long ``[b, T]`` global positions in ``[0, seq_len)``.
        positions: long ``[S_local]`` the global positions this rank holds (distinct).

    Returns:
        ``(index [b, T], held [b, T] bool)``: ``positions[index] == at`` where ``held``;
        ``index`` is 0 (a valid index) where the position lies on another rank.
    """
    where = torch.full((seq_len,), -1, dtype=torch.long, device=at.device)
    where[positions.to(at.device)] = torch.arange(positions.numel(), device=at.device)
    loc = where[at]
    return loc.clamp(min=0), loc >= 0


class _GroupSum(torch.autograd.Function):
    """All-reduce (sum) in the forward, identity in the backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


def group_sum(x: Tensor, group: Any) -> Tensor:
    """Sum of ``x`` over the ranks of ``group`` (forward), gradient passed through unchanged
    (backward): the gather of per-token statistics that each rank computed for its own
    tokens (0 elsewhere), when every rank then computes the same loss from the sum.

    ``group`` ``None`` or of size 1: ``x`` itself.
    """
    if group is None or dist.get_world_size(group) == 1:
        return x
    return _GroupSum.apply(x, group)


def allreduce_grads(params: Any, group: Any) -> None:
    """Sum the ``.grad`` of ``params`` over ``group`` in place (the context-parallel ranks
    of a replica each hold part of the gradient).  Parameters without a gradient are
    skipped; every rank must hold the same parameters in the same order."""
    if group is None or dist.get_world_size(group) == 1:
        return
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)


# ---------------------------------------------------------------------------- pipeline parallel


def run_pipeline(model: Any, micro_batches: list[Any], step: Callable[[Any, Any], tuple[Tensor, Callable]], *,
                 seq_length: int, micro_batch_size: int, forward_only: bool, cuda: bool) -> list[Any]:
    """Megatron-core's pipeline schedule (non-interleaved 1F1B) over ``micro_batches``.

    Args:
        model: this stage's ``GPTModel`` (built with ``pre_process``/``post_process``).
        step: ``step(micro_batch, model) -> (output, loss_func)`` (megatron's
            ``forward_step_func`` without the iterator): ``output`` is the stage's output
            (hidden states ``[s, b, H]`` float32, or the last stage's logits), and on the last
            stage ``loss_func(output) -> (loss, num_tokens, record)``; with the
            ``calculate_per_token_loss`` model config (set by
            :func:`relax_megatron.convert.build_gpt_model`) megatron backpropagates ``loss``
            unscaled, so micro-batch losses already scaled by the global denominators add up
            to the batch's loss.
        seq_length / micro_batch_size: the shape ``[seq_length, micro_batch_size, H]`` of
            the hidden states every micro-batch sends (all micro-batches must have it).
        forward_only: no backward (no-grad forward passes).
        cuda: ``False``: run under :func:`~relax_megatron.shim.cuda_on_cpu`.

    Returns:
        the ``record`` of every micro-batch, in order, on the last stage; ``[]`` on others.
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from relax_megatron.shim import cuda_on_cpu

    with contextlib.nullcontext() if cuda else cuda_on_cpu():
        return get_forward_backward_func()(
            forward_step_func=lambda it, m: step(next(it), m), data_iterator=iter(micro_batches), model=model,
            num_microbatches=len(micro_batches), seq_length=seq_length, micro_batch_size=micro_batch_size,
            forward_only=forward_only)


def broadcast_from_last_stage(obj: Any, device: torch.device) -> Any:
    """The last pipeline stage's ``obj`` on every stage of this rank's pipeline.

    ``obj``: a tensor (its shape and dtype must already be known on every stage; it is
    filled in place there and returned on CPU) or any picklable object.
    """
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() == 1:
        return obj
    src, group = ps.get_pipeline_model_parallel_last_rank(), ps.get_pipeline_model_parallel_group()
    if isinstance(obj, Tensor):
        t = obj.to(device).contiguous()
        dist.broadcast(t, src=src, group=group)
        return t.cpu()
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group, device=device)
    return box[0]


def allreduce_tied_embedding_grads(model: Any) -> None:
    """With tied input/output embeddings and PP > 1 the first stage's word embeddings and
    the last stage's output layer are two copies of one matrix: sum their gradients over
    Megatron's embedding group (both copies then take the same optimizer step).  No-op
    otherwise."""
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() == 1 or not model.share_embeddings_and_output_weights:
        return
    if not ps.is_rank_in_embedding_group():
        return
    w = model.shared_embedding_or_output_weight()
    if w.grad is None:
        w.grad = torch.zeros_like(w)
    dist.all_reduce(w.grad, group=ps.get_embedding_group())
