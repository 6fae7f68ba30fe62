"""The Megatron-core training backend: a ``GPTModel`` built from a Hugging Face config,
trained with the same contract as the torch backend (:class:`relax_core.contracts.TrainBackend`).

One process per tensor-parallel rank (``torchrun --nproc-per-node TP``, or a single process
for TP = 1, which initialises a one-rank gloo/nccl group itself).  Every rank holds the
whole batch; the vocabulary dimension of the logits stays sharded and the token
statistics are computed vocab-parallel (:func:`token_stats`), so the full ``[b, T, V]``
logits never exist on one rank.

Per micro-batch the sequence of sample ``i`` is ``prompt_i ++ response_i`` (right-padded);
the logits at position ``P_i + t - 1`` give the distribution of response token ``t``.
Causal attention makes the right padding invisible to real tokens.

On CPU the shim of :mod:`relax_megatron.shim` is installed.  The optimizer is
``torch.optim.AdamW`` on every device: Megatron's distributed optimizer, context
parallelism and pipeline parallelism are not wired in yet (declared unsupported, so
``--context-parallel-size``/``--pipeline-parallel-size`` > 1 are refused at startup).
"""

from __future__ import annotations

import json
import math
import os
import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from relax_core.contracts import ForwardOutput, TrainBatch
from relax_megatron import convert
from relax_megatron.shim import install_cpu_shim, seed_tracker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_parallel(tp: int, *, seed: int, cuda: bool) -> None:
    """Initialise torch.distributed (if the launcher has not) and Megatron's TP groups.

    Raises:
        ValueError: the world size is not the tensor-parallel size (data parallelism is
            not supported by this backend).
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
    if dist.get_world_size() != tp:
        raise ValueError(f"the megatron backend runs one process per tensor-parallel rank: world size "
                         f"{dist.get_world_size()} != --tensor-parallel-size {tp} (data parallelism is not supported)")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(tensor_model_parallel_size=tp)
    seed_tracker(seed, ps.get_tensor_model_parallel_rank())


def token_stats(logits: Tensor, targets: Tensor, *, entropy: bool = False,
                top_k_ids: Tensor | None = None) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Log-probs of ``targets``, entropy and log-probs at ``top_k_ids`` from vocab-sharded logits.

    ``logits`` ``[b, T, V/tp]`` is this rank's slice (vocabulary ids ``[r·V/tp, (r+1)·V/tp)``)
    of the full logits; the statistics are those of the full-vocabulary softmax, all-reduced
    over the TP group (forward: sum; backward: identity, as every rank holds the same loss)::

        log p(y) = z_y − log Σ_v exp z_v          (z = logits − max, in float32)
        H        = log Σ exp z − Σ_v p_v z_v

    Args:
        logits: ``[b, T, V/tp]`` (any float dtype; computed in float32).
        targets: long ``[b, T]`` token ids in ``[0, V)``.
        entropy: also return the entropy ``[b, T]`` (nats).
        top_k_ids: long ``[b, T, k]``: also return ``log p`` at these ids ``[b, T, k]``.

    Returns:
        ``(log_probs [b, T], entropy or None, top_k_log_probs or None)``, float32.
    """
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region as tp_sum

    tp = ps.get_tensor_model_parallel_world_size()
    z = logits.float()
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


class MegatronBackend:
    """:class:`~relax_core.contracts.TrainBackend` on Megatron-core (actor and reference roles)."""

    def __init__(self, hf_config: Any, hf_state_dict: dict[str, Tensor], *, tp: int = 1, lr: float = 1e-5,
                 weight_decay: float = 0.0, clip_grad: float = 1.0, warmup_steps: int = 0,
                 micro_batch_size: int | None = None, seed: int = 1234, bf16: bool = False,
                 ref_state_dict: dict[str, Tensor] | None = None, model_source: str | None = None) -> None:
        self.cuda = torch.cuda.is_available()
        init_parallel(tp, seed=seed, cuda=self.cuda)
        from megatron.core import parallel_state as ps

        self.ps = ps
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.cuda else torch.device("cpu")
        self.hf_config = hf_config
        self.arch = convert.arch_from_hf_config(hf_config)
        convert.check_tp(self.arch, tp)
        self.dtype = torch.bfloat16 if bf16 else torch.float32
        self.model = self._build(hf_state_dict)
        self.ref = self._build(ref_state_dict).eval().requires_grad_(False) if ref_state_dict is not None else None
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)
        self.base_lr, self.clip_grad, self.warmup_steps = lr, clip_grad, warmup_steps
        self.micro_batch_size = micro_batch_size
        self.model_source = model_source
        self.step = 0

    def _build(self, state_dict: dict[str, Tensor]) -> Any:
        model = convert.build_gpt_model(self.arch, params_dtype=self.dtype, bf16=self.dtype == torch.bfloat16)
        convert.load_hf_state_dict(model, state_dict, self.arch)
        return model.to(self.device)

    # ------------------------------------------------------------------ forward
    def _forward(self, model: Any, mb: TrainBatch, *, entropy: bool, top_k: bool) -> ForwardOutput:
        ids, pos, at = pack_sequences(mb.prompt_ids, mb.response_ids.clamp(0, self.arch.vocab_size - 1))
        s = ids.shape[1]
        causal = torch.triu(torch.ones(s, s, dtype=torch.bool, device=self.device), diagonal=1)[None, None]
        logits = model(ids.to(self.device), pos.to(self.device), causal)  # [b, S, V/tp]
        at = at.to(self.device)
        picked = logits.gather(1, at.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))  # [b, T, V/tp]
        targets = mb.response_ids.to(self.device).clamp(0, self.arch.vocab_size - 1)
        top_ids = mb.tensors["top_k_ids"].to(self.device).clamp(0, self.arch.vocab_size - 1) if top_k else None
        lp, ent, top = token_stats(picked, targets, entropy=entropy, top_k_ids=top_ids)
        return ForwardOutput(log_probs=lp, entropy=ent, top_k_log_probs=top)

    def _micro_batches(self, batch: TrainBatch) -> list[TrainBatch]:
        n = batch.size
        size = self.micro_batch_size or n
        return [TrainBatch(prompt_ids=batch.prompt_ids[i:i + size], response_ids=batch.response_ids[i:i + size],
                           loss_mask=batch.loss_mask[i:i + size],
                           tensors={k: v[i:i + size] for k, v in batch.tensors.items()})
                for i in range(0, n, size)]

    def forward(self, batch: TrainBatch, *, role: str = "actor", entropy: bool = False,
                top_k: bool = False) -> ForwardOutput:
        """Log-probs (and entropy, top-k log-probs) of the batch's responses without grad.

        Raises:
            ValueError: ``role`` is ``critic`` (not supported) or ``ref`` without a
                reference model.
        """
        if role == "actor":
            model = self.model
        elif role == "ref" and self.ref is not None:
            model = self.ref
        else:
            raise ValueError(f"megatron backend has no {role!r} model")
        model.eval()
        with torch.no_grad():
            outs = [self._forward(model, mb, entropy=entropy, top_k=top_k) for mb in self._micro_batches(batch)]
        cat = lambda xs: None if xs[0] is None else torch.cat(xs).cpu()  # noqa: E731
        return ForwardOutput(log_probs=cat([o.log_probs for o in outs]), entropy=cat([o.entropy for o in outs]),
                             top_k_log_probs=cat([o.top_k_log_probs for o in outs]))

    # ------------------------------------------------------------------ training
    def _grad_norm(self) -> float:
        """Global L2 norm of the gradient: TP-sharded parameters summed over the TP group,
        replicated ones (the RMSNorm weights, identical on every rank) counted once.

        Sharding is read from the parameter names (every non-norm tensor of the local spec
        is split over TP): with ``perform_initialization=False`` Megatron does not set its
        ``tensor_model_parallel`` attribute on all of them.
        """
        sharded = torch.zeros((), dtype=torch.float64, device=self.device)
        replicated = torch.zeros((), dtype=torch.float64, device=self.device)
        for name, p in self.model.named_parameters():
            if p.grad is None:
                continue
            sq = p.grad.detach().double().pow(2).sum()
            if "layernorm" in name:
                replicated += sq
            else:
                sharded += sq
        if self.ps.get_tensor_model_parallel_world_size() > 1:
            dist.all_reduce(sharded, group=self.ps.get_tensor_model_parallel_group())
        return float((sharded + replicated).sqrt())

    def train_step(self, batch: TrainBatch, loss_fn: Any, *, role: str = "actor") -> dict[str, float]:
        """One optimizer step over ``batch`` (gradient accumulation over micro-batches).

        ``loss_fn(micro_batch, forward_output) -> (loss, metrics)`` returns the micro-batch's
        loss already scaled by the global denominators, so the accumulated gradient is the
        global batch's.  The step is skipped (gradients dropped) when the loss or the
        gradient norm is not finite.

        Returns:
            ``train/grad_norm`` (before clipping), ``train/lr``, ``train/step_skipped``.

        Raises:
            ValueError: ``role`` is not ``actor``.
        """
        if role != "actor":
            raise ValueError(f"megatron backend trains only the actor, not {role!r}")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for mb in self._micro_batches(batch):
            out = self._forward(self.model, mb, entropy=getattr(loss_fn, "needs_entropy", False),
                                top_k=getattr(loss_fn, "needs_top_k", False))
            loss, _ = loss_fn(mb, out)
            loss.backward()
            total += float(loss.detach())
        norm = self._grad_norm()
        lr = self.base_lr * min(1.0, (self.step + 1) / self.warmup_steps) if self.warmup_steps else self.base_lr
        skipped = not (math.isfinite(total) and math.isfinite(norm))
        if skipped:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            if self.clip_grad > 0 and norm > self.clip_grad:
                scale = self.clip_grad / (norm + 1e-6)
                for p in self.model.parameters():
                    if p.grad is not None:
                        p.grad.mul_(scale)
            for g in self.optimizer.param_groups:
                g["lr"] = lr
            self.optimizer.step()
            self.step += 1
        return {"train/grad_norm": norm, "train/lr": lr, "train/step_skipped": float(skipped)}

    # ------------------------------------------------------------------ weights out
    def _all_shards(self) -> list[dict[str, Tensor]]:
        local = convert.local_state_dict(self.model)
        tp = self.ps.get_tensor_model_parallel_world_size()
        if tp == 1:
            return [local]
        group = self.ps.get_tensor_model_parallel_group()
        shards: list[dict[str, Tensor]] = [{} for _ in range(tp)]
        for name, t in local.items():
            parts = [torch.empty_like(t, device=self.device) for _ in range(tp)]
            dist.all_gather(parts, t.to(self.device).contiguous(), group=group)
            for r, part in enumerate(parts):
                shards[r][name] = part.cpu()
        return shards

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
        if self.model_source is not None:
            load_tokenizer(self.model_source).save_pretrained(path)

    def save_checkpoint(self, path: str) -> None:
        """This rank's Megatron weights (safetensors) and optimizer state, plus the step."""
        from safetensors.torch import save_file

        r = self.ps.get_tensor_model_parallel_rank()
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in convert.local_state_dict(self.model).items()},
                  str(out / f"megatron_tp{r}.safetensors"))
        torch.save(self.optimizer.state_dict(), out / f"optimizer_tp{r}.pt")
        if r == 0:
            (out / "megatron_backend.json").write_text(json.dumps({"step": self.step}))

    def load_checkpoint(self, path: str) -> None:
        """Inverse of :meth:`save_checkpoint` (same TP size)."""
        from safetensors.torch import load_file

        r = self.ps.get_tensor_model_parallel_rank()
        src = Path(path)
        sd = load_file(str(src / f"megatron_tp{r}.safetensors"))
        missing, unexpected = self.model.load_state_dict(sd, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        if missing or unexpected:
            raise KeyError(f"checkpoint {src} does not match the model: missing {missing}, unexpected {unexpected}")
        self.optimizer.load_state_dict(torch.load(src / f"optimizer_tp{r}.pt", weights_only=True))
        self.step = json.loads((src / "megatron_backend.json").read_text())["step"]


def build(params: Any, config: Any) -> MegatronBackend:
    """Factory: load ``--model`` (and ``--ref-load`` when a KL term needs it) and build the backend."""
    from relax_core.models import load_model

    hf = load_model(config.model)
    ref_sd = None
    if config.needs_reference_model:
        ref_sd = load_model(config.ref_load).state_dict() if config.ref_load else hf.state_dict()
    return MegatronBackend(
        hf.config, hf.state_dict(), tp=config.tensor_parallel_size, lr=config.lr,
        weight_decay=config.weight_decay, clip_grad=config.clip_grad, warmup_steps=config.lr_warmup_steps,
        micro_batch_size=config.micro_batch_size, seed=config.seed, bf16=config.bf16,
        ref_state_dict=ref_sd, model_source=config.model)
