"""The Megatron-core training backend: a ``GPTModel`` built from a Hugging Face config,
trained with the same contract as the torch backend (:class:`relax_core.contracts.TrainBackend`).

One process per tensor-parallel rank: ``relax train --launcher ray
--actor-num-gpus-per-node TP`` (the Ray training workers form the gloo/NCCL group, see
:mod:`relax_core.distributed`), ``torchrun --nproc-per-node TP``, or a single process for
TP = 1, which initialises a one-rank gloo/nccl group itself.  Every rank of the
tensor-parallel group holds the same samples (one data-parallel replica,
:meth:`MegatronBackend.data_parallel`); the vocabulary dimension of the logits stays sharded
and the token statistics are computed vocab-parallel (:func:`token_stats`), so the full ``[b, T, V]``
logits never exist on one rank.

Per micro-batch the sequence of sample ``i`` is ``prompt_i ++ response_i`` (right-padded);
the logits at position ``P_i + t - 1`` give the distribution of response token ``t``.
Causal attention makes the right padding invisible to real tokens.

Pipeline parallel (``--pipeline-parallel-size``): each stage holds its layers and
megatron-core's 1F1B schedule runs the micro-batches; the token statistics and the loss
are computed on the last stage and its results broadcast to every stage.  Context parallel
(``--context-parallel-size``, CUDA with Transformer Engine only): each rank runs the model
on its load-balanced chunks of every sequence and the per-token statistics are gathered to
the full ``[b, T]`` layout before the loss (:mod:`relax_megatron.parallel` says why).

On CPU the shim of :mod:`relax_megatron.shim` is installed.  The optimizer is
``torch.optim.AdamW`` on every device: Megatron's distributed optimizer is not wired in.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from relax_core.batch import Batch
from relax_core.contracts import ForwardOutput, Gradients
from relax_core.stages.optimizer import step_torch_optimizer
from relax_megatron import convert
from relax_megatron.parallel import (
    allreduce_grads,
    allreduce_tied_embedding_grads,
    broadcast_from_last_stage,
    cp_positions,
    group_sum,
    local_index,
    padded_length,
    run_pipeline,
)
from relax_megatron.shim import install_cpu_shim, seed_tracker

CP_NEEDS = ("--context-parallel-size > 1 needs CUDA and Transformer Engine: megatron-core 0.16.1 supports context "
            "parallelism only in TEDotProductAttention (its local DotProductAttention asserts context_parallel_size == 1)")
CP_FIX = "use --context-parallel-size 1, or run on CUDA with transformer_engine installed (pip install transformer_engine[pytorch])"


def context_parallel_problem(cp: int, *, cuda: bool) -> str | None:
    """Why ``cp`` context-parallel ranks cannot run here (``None`` if they can)."""
    if cp == 1:
        return None
    missing = [what for what, ok in (("no CUDA device is visible", cuda),
                                     ("transformer_engine is not installed",
                                      importlib.util.find_spec("transformer_engine") is not None)) if not ok]
    return f"{CP_NEEDS}; here {' and '.join(missing)}" if missing else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_parallel(tp: int, *, pp: int = 1, cp: int = 1, seed: int, cuda: bool) -> None:
    """Initialise torch.distributed (if the launcher has not) and Megatron's TP, PP and CP
    groups (Megatron's rank order: TP fastest, then CP, then PP).

    Raises:
        ValueError: the world size is not ``tp × cp × pp`` (data parallelism is not
            supported by this backend).
    """
    from megatron.core import parallel_state as ps

    if not cuda:
        install_cpu_shim()
    if not dist.is_initialized():
        backend = "nccl" if cuda else "gloo"
        if "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend)
        else:
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    if dist.get_world_size() != tp * cp * pp:
        raise ValueError(f"the megatron backend runs one process per model-parallel rank: world size "
                         f"{dist.get_world_size()} != tensor × context × pipeline parallel size {tp}×{cp}×{pp} "
                         "(data parallelism is not supported)")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                     context_parallel_size=cp)
    seed_tracker(seed, ps.get_tensor_model_parallel_rank())


def token_stats(logits: Tensor, targets: Tensor, *, temperature: float = 1.0, entropy: bool = False,
                top_k_ids: Tensor | None = None) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Log-probs of ``targets``, entropy and log-probs at ``top_k_ids`` from vocab-sharded logits.

    ``logits`` ``[b, T, V/tp]`` is this rank's slice (vocabulary ids ``[r·V/tp, (r+1)·V/tp)``)
    of the full logits; the statistics are those of the full-vocabulary softmax at
    temperature ``τ`` (the rollout temperature, as in the torch backend, so that they compare
    with the engine's log q), all-reduced over the TP group (forward: sum; backward:
    identity, as every rank holds the same loss)::

        log p(y) = z_y − log Σ_v exp z_v          (z = logits / τ − max, in float32)
        H        = log Σ exp z − Σ_v p_v z_v

    Args:
        logits: ``[b, T, V/tp]`` (any float dtype; computed in float32).
        temperature: ``τ > 0``.
        targets: long ``[b, T]`` token ids in ``[0, V)``.
        entropy: also return the entropy ``[b, T]`` (nats).
        top_k_ids: long ``[b, T, k]``: also return ``log p`` at these ids ``[b, T, k]``.

    Returns:
        ``(log_probs [b, T], entropy or None, top_k_log_probs or None)``, float32.
    """
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region as tp_sum

    tp = ps.get_tensor_model_parallel_world_size()
    z = logits.float() / temperature
    vl = z.shape[-1]
    start = ps.get_tensor_model_parallel_rank() * vl
    m = z.detach().max(dim=-1, keepdim=True).values  # [b, T, 1]; a constant shift
    if tp > 1:
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=ps.get_tensor_model_parallel_group())
    z = z - m
    e = z.exp()
    sumexp = tp_sum(e.sum(-1))  # [b, T]
    log_z = sumexp.log()

    def pick(ids: Tensor) -> Tensor:  # z at global ids (0 on other ranks' shards), summed over TP
        local = ids - start
        inside = (local >= 0) & (local < vl)
        val = z.gather(-1, local.clamp(0, vl - 1)) * inside
        return tp_sum(val)

    log_probs = pick(targets.unsqueeze(-1)).squeeze(-1) - log_z
    ent = log_z - tp_sum((e * z).sum(-1)) / sumexp if entropy else None
    top = pick(top_k_ids) - log_z.unsqueeze(-1) if top_k_ids is not None else None
    return log_probs, ent, top


def pack_sequences(prompt_ids: list[list[int]], response_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``prompt ++ response`` rows, their positions, and where each response token is predicted.

    Returns:
        ``input_ids`` long ``[b, S]`` (``S = max P + T``, right padding with 0),
        ``position_ids`` long ``[b, S]``, and ``predict_at`` long ``[b, T]`` = ``P_i + t − 1``,
        the position whose logits give response token ``t``.

    Raises:
        ValueError: an empty prompt (the first response token would have no context).
    """
    b, t = response_ids.shape
    lengths = torch.tensor([len(p) for p in prompt_ids], dtype=torch.long)
    if b and int(lengths.min()) < 1:
        raise ValueError("every sample needs a non-empty prompt")
    prompts = torch.nn.utils.rnn.pad_sequence([torch.tensor(p, dtype=torch.long) for p in prompt_ids],
                                              batch_first=True)
    s = prompts.shape[1] + t
    ids = torch.cat([prompts, torch.zeros(b, t, dtype=torch.long)], dim=1)
    at = lengths[:, None] + torch.arange(t)  # [b, T] absolute positions of the response
    ids.scatter_(1, at, response_ids.long())
    positions = torch.arange(s).expand(b, s)
    return ids, positions, at - 1


def _pad_rows(mb: Batch, size: int) -> Batch:
    """``mb`` with ``size − b`` masked copies of its last sample appended (``b <= size``)."""
    k = size - mb.size
    if k == 0:
        return mb
    padded = mb.select(list(range(mb.size)) + [mb.size - 1] * k)
    return padded.replace(loss_mask=torch.cat([mb.loss_mask, torch.zeros(k, *mb.loss_mask.shape[1:],
                                                                          dtype=mb.loss_mask.dtype)]))


class MegatronBackend:
    """:class:`~relax_core.contracts.TrainBackend` on Megatron-core (actor and reference roles).

    Args:
        hf_config / hf_state_dict: the Hugging Face config and full weights of the actor.
        tp / pp / cp: tensor-, pipeline- and context-parallel sizes (world size = tp·pp·cp).
        temperature: ``--rollout-temperature`` (1 when 0); log-probs, entropy and top-k
            log-probs are those of ``softmax(z / τ)``, like the torch backend's.
        ref_loader: ``() -> HF state dict`` of the reference model, called by
            :meth:`setup` when a reference is needed.
        device: ``--device``: ``auto`` (CUDA when visible, else CPU with the shim), ``cuda``
            or ``cpu`` (refused on a machine with CUDA).
        bf16: ``--bf16``: bfloat16 autocast in the forward, float32 weights and optimizer
            state, float32 log-softmax (as the torch backend).
        lr / weight_decay: AdamW's (the core sets each step's learning rate,
            :mod:`relax_core.stages.optimizer`).
        Other arguments: the run's batching flags.
    """

    def __init__(self, hf_config: Any, hf_state_dict: dict[str, Tensor], *, tp: int = 1, pp: int = 1, cp: int = 1,
                 lr: float = 1e-5, weight_decay: float = 0.0,
                 micro_batch_size: int | None = None, seed: int = 1234, bf16: bool = False, temperature: float = 1.0,
                 ref_loader: Any = None, tokenizer_source: str | None = None, device: str = "auto") -> None:
        if device == "cpu" and torch.cuda.is_available():
            raise ValueError("--train-backend megatron with --device cpu on a machine with CUDA is not supported "
                             "(its CPU shim patches torch.cuda); use --device cuda or auto")
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda but no CUDA device is visible")
        self.cuda = torch.cuda.is_available()
        if (problem := context_parallel_problem(cp, cuda=self.cuda)) is not None:
            raise ValueError(f"{problem} (fix: {CP_FIX})")
        init_parallel(tp, pp=pp, cp=cp, seed=seed, cuda=self.cuda)
        from megatron.core import parallel_state as ps

        self.ps = ps
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.cuda else torch.device("cpu")
        self.hf_config = hf_config
        self.arch = convert.arch_from_hf_config(hf_config)
        convert.check_tp(self.arch, tp)
        convert.check_pp(self.arch, pp)
        self.pp, self.cp = pp, cp
        self.bf16 = bf16
        self.temperature = temperature if temperature > 0 else 1.0
        self.model = self._build(hf_state_dict)
        self.ref: Any = None
        self.ref_loader = ref_loader
        self.needs_top_k = False
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)
        self.micro_batch_size = micro_batch_size
        self.tokenizer_source = tokenizer_source
        self.step = 0

    def _build(self, state_dict: dict[str, Tensor]) -> Any:
        # float32 weights (the master copy with --bf16); stages exchange the layers' output dtype
        model = convert.build_gpt_model(self.arch, pipeline_dtype=torch.bfloat16 if self.bf16 else torch.float32)
        convert.load_hf_state_dict(model, state_dict, self.arch)
        return model.to(self.device).eval()

    def setup(self, *, needs_ref: bool = False, needs_critic: bool = False, needs_top_k: bool = False,
              routing_replay: bool = False, critic_settings: Any = None) -> None:
        """Build the roles the run needs (called once by the launcher).

        Raises:
            ValueError: a critic or routing replay is asked (declared unsupported, so the
                startup validation refuses such runs first), or a reference without a loader.
        """
        if needs_critic or routing_replay:
            raise ValueError("the megatron backend trains no critic and does not replay routes")
        self.needs_top_k = needs_top_k
        if needs_ref and self.ref is None:
            if self.ref_loader is None:
                raise ValueError("a reference model is needed but no ref_loader was given")
            self.ref = self._build(self.ref_loader()).requires_grad_(False)

    def data_parallel(self) -> tuple[int, int, Any]:
        """``(dp_rank, dp_size, dp_group)`` from Megatron's parallel state: the ranks of one
        tensor-parallel group are one replica and train on the same samples (``dp_group``
        is ``None`` for a single replica).  The launcher shards batches by ``dp_rank`` and
        reduces batch-wide estimator statistics over ``dp_group`` only."""
        size = self.ps.get_data_parallel_world_size()
        return self.ps.get_data_parallel_rank(), size, self.ps.get_data_parallel_group() if size > 1 else None

    # ------------------------------------------------------------------ forward
    def _inputs(self, mb: Batch, *, top_k: bool, seq_len: int | None = None) -> dict[str, Any]:
        """This rank's model inputs for one micro-batch and where its response tokens are.

        Sequences are right-padded to ``seq_len`` (default: the micro-batch's ``max P + T``)
        rounded up to a multiple of ``2·CP``; with CP > 1 this rank keeps its chunks
        (:func:`~relax_megatron.parallel.cp_positions`) and Transformer Engine applies the
        causal mask (``causal`` is ``None``).

        Returns:
            ``ids``/``pos`` long ``[b, S/CP]``, ``causal`` bool ``[1, 1, S, S]`` or ``None``,
            ``index``/``held`` ``[b, T]`` (local position predicting each response token,
            and whether this rank holds it), ``targets`` long ``[b, T]`` (valid ids),
            ``top_ids`` long ``[b, T, k]`` or ``None``.

        Raises:
            ValueError: response ids outside the vocabulary at ``loss_mask`` positions.
            KeyError: ``top_k`` without the batch's ``top_k_ids``.
        """
        v = self.arch.vocab_size
        mask = mb.loss_mask.bool()
        resp = mb.response_ids.long()
        in_range = (resp >= 0) & (resp < v)
        if not in_range[mask].all():
            raise ValueError(f"response token ids outside the vocabulary [0, {v}) at loss_mask positions")
        resp = torch.where(in_range, resp, 0)  # garbage off the mask: any valid id
        ids, _, at = pack_sequences(mb.prompt_ids, resp)
        s = padded_length(max(seq_len or 0, ids.shape[1]), 2 * self.cp if self.cp > 1 else 1)
        ids = torch.nn.functional.pad(ids, (0, s - ids.shape[1]))
        held_pos = cp_positions(s, self.cp, self.ps.get_context_parallel_rank()) if self.cp > 1 else torch.arange(s)
        index, held = local_index(at, held_pos, s)
        causal = None if self.cp > 1 else torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)[None, None]
        top_ids = None
        if top_k:
            if mb.top_k_ids is None:
                raise KeyError("top-k log-probs asked but the batch has no top_k_ids")
            top_ids = mb.top_k_ids.long().clamp(0, v - 1)
        d = self.device
        return {"ids": ids[:, held_pos].to(d), "pos": held_pos.expand(ids.shape[0], -1).to(d),
                "causal": None if causal is None else causal.to(d), "index": index.to(d), "held": held.to(d),
                "mask": mask.to(d), "targets": resp.to(d), "top_ids": None if top_ids is None else top_ids.to(d)}

    def _run_model(self, model: Any, inp: dict[str, Any]) -> Tensor:
        """The stage's output: logits ``[b, S/CP, V/tp]`` on the last pipeline stage, hidden
        states ``[S/CP, b, H]`` in the model's ``pipeline_dtype`` on the others."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            out = model(inp["ids"], inp["pos"], inp["causal"])
        return out if model.post_process else out.to(model.config.pipeline_dtype)

    def _stats(self, logits: Tensor, inp: dict[str, Any], *, entropy: bool) -> ForwardOutput:
        """Token statistics ``[b, T]`` of the response tokens from this rank's logits
        ``[b, S/CP, V/tp]`` (vocab-parallel over TP, gathered over CP); 0 off ``loss_mask``."""
        picked = logits.gather(1, inp["index"].unsqueeze(-1).expand(-1, -1, logits.shape[-1]))  # [b, T, V/tp]
        lp, ent, top = token_stats(picked, inp["targets"], temperature=self.temperature, entropy=entropy,
                                   top_k_ids=inp["top_ids"])
        keep = inp["mask"] & inp["held"]  # [b, T]: the tokens this CP rank computed
        cp_group = self.ps.get_context_parallel_group() if self.cp > 1 else None

        def out(x: Tensor | None) -> Tensor | None:
            return None if x is None else group_sum(torch.where(keep.view(*keep.shape, *[1] * (x.dim() - 2)), x, 0.0),
                                                    cp_group)

        return ForwardOutput(log_probs=out(lp), entropy=out(ent), top_k_log_probs=out(top))

    def _forward(self, model: Any, mb: Batch, *, entropy: bool, top_k: bool) -> ForwardOutput:
        """One micro-batch without pipeline parallelism; values are 0 off ``loss_mask``."""
        inp = self._inputs(mb, top_k=top_k)
        return self._stats(self._run_model(model, inp), inp, entropy=entropy)

    def _pipeline(self, model: Any, mbs: list[Batch], *, entropy: bool, top_k: bool,
                  loss_fn: Any = None) -> list[Any]:
        """Micro-batches through megatron-core's pipeline schedule (PP > 1).

        All micro-batches are given one shape (megatron's point-to-point buffers): rows
        padded to the largest micro-batch with masked copies of its last sample, sequences
        to the batch's longest; padding rows are dropped before the statistics are used.
        ``loss_fn`` ``None``: no-grad forward, records are the micro-batches' ``ForwardOutput``;
        else forward and backward, records are ``{"loss": float, **metrics}``.

        Returns:
            the records, in micro-batch order, on the last stage; ``[]`` on the others.
        """
        size = max(mb.size for mb in mbs)
        seq = padded_length(max(len(p) for mb in mbs for p in mb.prompt_ids) + mbs[0].response_ids.shape[1],
                            2 * self.cp if self.cp > 1 else 1)

        def step(mb: Batch, m: Any) -> tuple[Tensor, Any]:
            inp = self._inputs(_pad_rows(mb, size), top_k=top_k, seq_len=seq)
            output = self._run_model(m, inp)

            def loss_func(logits: Tensor) -> tuple[Tensor, Tensor, Any]:
                full = self._stats(logits, inp, entropy=entropy)
                fwd = ForwardOutput(**{k: None if v is None else v[:mb.size] for k, v in vars(full).items()})
                if loss_fn is None:
                    return torch.zeros((), device=logits.device), torch.ones((), dtype=torch.int), fwd
                loss, metrics = loss_fn(mb, fwd)
                return loss, torch.ones((), dtype=torch.int), {"loss": float(loss.detach()), **metrics}

            return output, loss_func

        return run_pipeline(model, mbs, step, seq_length=seq, micro_batch_size=size, forward_only=loss_fn is None,
                            cuda=self.cuda)

    def _micro_batches(self, batch: Batch) -> list[Batch]:
        n = batch.size
        size = self.micro_batch_size or n
        return [batch.slice(i, min(n, i + size)) for i in range(0, n, size)]

    def forward(self, batch: Batch, *, role: str = "actor", entropy: bool = False,
                top_k: bool = False) -> ForwardOutput:
        """No-grad log-probs (and entropy, top-k log-probs) ``[B, T]`` of the batch's
        responses, float32 on CPU, 0 off ``loss_mask``.

        Raises:
            ValueError: ``role`` is ``critic`` (not supported) or ``ref`` before
                ``setup(needs_ref=True)``.
        """
        if role == "actor":
            model = self.model
        elif role == "ref" and self.ref is not None:
            model = self.ref
        else:
            raise ValueError(f"megatron backend has no {role!r} model")
        model.eval()
        mbs = self._micro_batches(batch)
        with torch.no_grad():
            if self.pp == 1:
                outs = [self._forward(model, mb, entropy=entropy, top_k=top_k) for mb in mbs]
            else:
                outs = self._pipeline(model, mbs, entropy=entropy, top_k=top_k)
        if self.pp > 1:  # the last stage's statistics, on every stage
            b, t = batch.response_ids.shape
            k = batch.top_k_ids.shape[-1] if top_k else 0
            shapes = {"log_probs": (b, t), "entropy": (b, t) if entropy else None, "top_k_log_probs": (b, t, k) if top_k else None}
            last = self.ps.is_pipeline_last_stage()
            return ForwardOutput(**{name: None if shape is None else broadcast_from_last_stage(
                torch.cat([getattr(o, name) for o in outs]) if last else torch.zeros(shape), self.device)
                for name, shape in shapes.items()})
        cat = lambda xs: None if xs[0] is None else torch.cat(xs).cpu()  # noqa: E731
        return ForwardOutput(log_probs=cat([o.log_probs for o in outs]), entropy=cat([o.entropy for o in outs]),
                             top_k_log_probs=cat([o.top_k_log_probs for o in outs]))

    # ------------------------------------------------------------------ training
    def _allreduce_qk_layernorm_grads(self) -> None:
        """Sum the gradients of the q/k RMSNorm weights (Qwen3) over the TP group.

        These weights are replicated, but each rank normalises only its own attention
        heads, so each holds a partial gradient; the sum is the full one, equal on every
        rank, which keeps the replicas identical (Megatron's ``finalize_model_grads`` does
        the same when ``qk_layernorm`` is set).
        """
        if not self.arch.qk_layernorm or self.ps.get_tensor_model_parallel_world_size() == 1:
            return
        grads = [p.grad for name, p in self.model.named_parameters()
                 if p.grad is not None and ("q_layernorm" in name or "k_layernorm" in name)]
        if grads:
            flat = torch._utils._flatten_dense_tensors(grads)
            dist.all_reduce(flat, group=self.ps.get_tensor_model_parallel_group())
            for g, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
                g.copy_(synced)

    def grad_norm(self, role: str = "actor") -> float:
        """Global L2 norm of the actor's gradient: TP-sharded parameters summed over the TP group,
        replicated ones (the RMSNorm weights, identical on every rank once the q/k norm
        gradients are summed) counted once.

        Sharding is read from the parameter names (every non-norm tensor of the local spec
        is split over TP): with ``perform_initialization=False`` Megatron does not set its
        ``tensor_model_parallel`` attribute on all of them.  With PP the stages' sums are
        added, the last stage's copy of tied embeddings (``shared``) not counted.
        """
        self._check_role(role)
        sharded = torch.zeros((), dtype=torch.float64, device=self.device)
        replicated = torch.zeros((), dtype=torch.float64, device=self.device)
        for name, p in self.model.named_parameters():
            if p.grad is None or getattr(p, "shared", False):
                continue
            sq = p.grad.detach().double().pow(2).sum()
            if "layernorm" in name:
                replicated += sq
            else:
                sharded += sq
        if self.ps.get_tensor_model_parallel_world_size() > 1:
            dist.all_reduce(sharded, group=self.ps.get_tensor_model_parallel_group())
        total = sharded + replicated
        if self.pp > 1:
            dist.all_reduce(total, group=self.ps.get_pipeline_model_parallel_group())
        return float(total.sqrt())

    def _check_role(self, role: str) -> None:
        if role != "actor":
            raise ValueError(f"megatron backend trains only the actor, not {role!r}")

    def accumulate_gradients(self, batch: Batch, loss_fn: Any, *, role: str = "actor") -> Gradients:
        """Forward and backward of the actor over ``batch``'s micro-batches (``--micro-batch-size``
        samples) into cleared gradients, then the gradients' reductions (context-parallel sum,
        the q/k norms' TP sum, the tied embeddings' PP sum).

        ``loss_fn(micro_batch, forward_output) -> (loss, metrics)`` returns the micro-batch's
        loss already scaled by the global denominators, so the accumulated gradient is the
        global batch's.  A micro-batch whose loss is not finite is not backpropagated (with
        PP megatron's schedule backpropagates it; the core skips the step all the same).
        With PP ``loss_fn`` runs on the last stage; the others receive its results and
        metrics (``loss_fn.add_metrics``), so every rank returns the same.

        Returns:
            :class:`~relax_core.contracts.Gradients` (the torch backend's keys).

        Raises:
            ValueError: ``role`` is not ``actor``.
        """
        self._check_role(role)
        entropy = bool(getattr(loss_fn, "needs_entropy", True))
        top_k = bool(getattr(loss_fn, "needs_top_k", self.needs_top_k))
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {"loss": 0.0}
        bad: set[str] = set()

        def record(metrics: dict[str, Any]) -> None:
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v)
                if not math.isfinite(float(v)):
                    bad.add(k)

        mbs = self._micro_batches(batch)
        self.model.train()
        try:
            if self.pp == 1:
                for mb in mbs:
                    loss, metrics = loss_fn(mb, self._forward(self.model, mb, entropy=entropy, top_k=top_k))
                    record({**metrics, "loss": float(loss.detach())})
                    if math.isfinite(float(loss.detach())) and loss.requires_grad:
                        loss.backward()
            else:
                for rec in self._pipeline(self.model, mbs, entropy=entropy, top_k=top_k, loss_fn=loss_fn):
                    record(rec)
                own = loss_fn.metrics() if self.ps.is_pipeline_last_stage() and hasattr(loss_fn, "metrics") else None
                got_sums, got_bad, got_metrics = broadcast_from_last_stage((sums, bad, own), self.device)
                if not self.ps.is_pipeline_last_stage():
                    sums, bad = got_sums, got_bad
                    if got_metrics:
                        loss_fn.add_metrics(got_metrics)
                allreduce_tied_embedding_grads(self.model)
        finally:
            self.model.eval()
        if self.cp > 1:
            allreduce_grads(self.model.parameters(), self.ps.get_context_parallel_group())
        self._allreduce_qk_layernorm_grads()
        return Gradients(sums=sums, nonfinite=frozenset(bad), micro_batches=len(mbs))

    def apply_gradients(self, role: str = "actor", *, lr: float, grad_scale: float = 1.0) -> None:
        """Scale the gradients by ``grad_scale`` (the core's clip), then one AdamW step at ``lr``."""
        self._check_role(role)
        step_torch_optimizer(self.optimizer, lr=lr, grad_scale=grad_scale)
        self.step += 1

    def zero_grad(self, role: str = "actor") -> None:
        """Release the actor's gradients."""
        self._check_role(role)
        self.optimizer.zero_grad(set_to_none=True)

    def optimizer_steps(self, role: str = "actor") -> int:
        """Steps applied (restored by :meth:`load_checkpoint`)."""
        self._check_role(role)
        return self.step

    # ------------------------------------------------------------------ weights out
    def _all_shards(self) -> list[dict[str, Tensor]]:
        """Whole-model Megatron state dicts (CPU) of every TP rank: gathered over TP, then
        the pipeline stages' merged (:func:`~relax_megatron.convert.merge_stages`)."""
        local = convert.local_state_dict(self.model)
        tp = self.ps.get_tensor_model_parallel_world_size()
        shards: list[dict[str, Tensor]] = [local] if tp == 1 else [{} for _ in range(tp)]
        if tp > 1:
            group = self.ps.get_tensor_model_parallel_group()
            for name, t in local.items():
                parts = [torch.empty_like(t, device=self.device) for _ in range(tp)]
                dist.all_gather(parts, t.to(self.device).contiguous(), group=group)
                for r, part in enumerate(parts):
                    shards[r][name] = part.cpu()
        if self.pp == 1:
            return shards
        stages: list[Any] = [None] * self.pp
        dist.all_gather_object(stages, shards, group=self.ps.get_pipeline_model_parallel_group())
        return [convert.merge_stages([st[r] for st in stages], self.arch) for r in range(tp)]

    def _shard_name(self) -> str:
        """This rank's checkpoint file stem: ``tp{r}``, with PP ``tp{r}_pp{p}``."""
        name = f"tp{self.ps.get_tensor_model_parallel_rank()}"
        return f"{name}_pp{self.ps.get_pipeline_model_parallel_rank()}" if self.pp > 1 else name

    def engine_state_dict(self) -> dict[str, Tensor]:
        """Full Hugging Face-named weights (gathered over TP, on CPU) for the engines."""
        return convert.megatron_to_hf(self._all_shards(), self.arch)

    def save_hf(self, path: str) -> None:
        """Write a Hugging Face model directory (rank 0 writes; every rank must call)."""
        from transformers import AutoModelForCausalLM

        from relax_core.models import load_state_dict_, load_tokenizer

        sd = self.engine_state_dict()
        if dist.get_rank() != 0:
            return
        model = AutoModelForCausalLM.from_config(self.hf_config, dtype=torch.float32)
        load_state_dict_(model, sd)
        model.save_pretrained(path)
        if self.tokenizer_source is not None:
            load_tokenizer(self.tokenizer_source).save_pretrained(path)

    def save_checkpoint(self, path: str, include_optimizer: bool = True) -> None:
        """This rank's Megatron weights (safetensors) and optimizer state (one file per TP
        rank and pipeline stage, unless ``include_optimizer`` is False; context-parallel
        rank 0 writes them), plus the step
        (global rank 0); every rank calls it with the same ``path`` (a barrier ends it)."""
        from safetensors.torch import save_file

        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        if self.ps.get_context_parallel_rank() == 0:
            save_file({k: v.contiguous() for k, v in convert.local_state_dict(self.model).items()},
                      str(out / f"megatron_{self._shard_name()}.safetensors"))
            if include_optimizer:
                torch.save(self.optimizer.state_dict(), out / f"optimizer_{self._shard_name()}.pt")
        if dist.get_rank() == 0:
            (out / "megatron_backend.json").write_text(json.dumps({"step": self.step}))
        if dist.get_world_size() > 1:
            dist.barrier()

    def load_checkpoint(self, path: str) -> None:
        """Inverse of :meth:`save_checkpoint` (same TP and PP sizes); without an optimizer
        file the optimizer stays fresh."""
        from safetensors.torch import load_file

        src = Path(path)
        sd = load_file(str(src / f"megatron_{self._shard_name()}.safetensors"))
        missing, unexpected = self.model.load_state_dict(sd, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        if missing or unexpected:
            raise KeyError(f"checkpoint {src} does not match the model: missing {missing}, unexpected {unexpected}")
        if (src / f"optimizer_{self._shard_name()}.pt").is_file():
            self.optimizer.load_state_dict(torch.load(src / f"optimizer_{self._shard_name()}.pt", weights_only=True))
        self.step = json.loads((src / "megatron_backend.json").read_text())["step"]


def build(params: Any, config: Any) -> MegatronBackend:
    """Factory: load ``--model`` and build the backend (the reference model, when a KL term
    needs it, is loaded by ``setup`` from ``--ref-load`` or ``--model``).

    Raises:
        ImportError: megatron-core is not installed (the message gives the install line).
    """
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        from relax_megatron.plugin import INSTALL_HINT

        raise ImportError(f"--train-backend megatron needs megatron-core, which is not installed: {INSTALL_HINT}")
    from relax_core.models import load_model

    hf = load_model(config.model)
    return MegatronBackend(
        hf.config, hf.state_dict(), tp=config.tensor_parallel_size, pp=config.pipeline_parallel_size,
        cp=config.context_parallel_size, lr=config.lr,
        weight_decay=config.weight_decay,
        micro_batch_size=config.micro_batch_size, seed=config.seed, bf16=bool(config.bf16),
        temperature=config.rollout_temperature,
        ref_loader=lambda: load_model(config.ref_load or config.model).state_dict(),
        tokenizer_source=config.model, device=config.device)
