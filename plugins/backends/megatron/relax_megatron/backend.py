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

On CPU the shim of :mod:`relax_megatron.shim` is installed.  The optimizer is
``torch.optim.AdamW`` on every device: Megatron's distributed optimizer, context
parallelism and pipeline parallelism are not wired in yet (declared unsupported, so
``--context-parallel-size``/``--pipeline-parallel-size`` > 1 are refused at startup).
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


class MegatronBackend:
    """:class:`~relax_core.contracts.TrainBackend` on Megatron-core (actor and reference roles).

    Args:
        hf_config / hf_state_dict: the Hugging Face config and full weights of the actor.
        tp: tensor-parallel size (= world size).
        temperature: ``--rollout-temperature`` (1 when 0); log-probs, entropy and top-k
            log-probs are those of ``softmax(z / τ)``, like the torch backend's.
        ref_loader: ``() -> HF state dict`` of the reference model, called by
            :meth:`setup` when a reference is needed.
        device: ``--device``: ``auto`` (CUDA when visible, else CPU with the shim), ``cuda``
            or ``cpu`` (refused on a machine with CUDA).
        bf16: ``--bf16``: bfloat16 autocast in the forward, float32 weights and optimizer
            state, float32 log-softmax (as the torch backend).
        Other arguments: the run's optimizer and batching flags.
    """

    def __init__(self, hf_config: Any, hf_state_dict: dict[str, Tensor], *, tp: int = 1, lr: float = 1e-5,
                 weight_decay: float = 0.0, clip_grad: float = 1.0, warmup_steps: int = 0,
                 micro_batch_size: int | None = None, seed: int = 1234, bf16: bool = False, temperature: float = 1.0,
                 ref_loader: Any = None, tokenizer_source: str | None = None, device: str = "auto") -> None:
        if device == "cpu" and torch.cuda.is_available():
            raise ValueError("--train-backend megatron with --device cpu on a machine with CUDA is not supported "
                             "(its CPU shim patches torch.cuda); use --device cuda or auto")
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda but no CUDA device is visible")
        self.cuda = torch.cuda.is_available()
        init_parallel(tp, seed=seed, cuda=self.cuda)
        from megatron.core import parallel_state as ps

        self.ps = ps
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.cuda else torch.device("cpu")
        self.hf_config = hf_config
        self.arch = convert.arch_from_hf_config(hf_config)
        convert.check_tp(self.arch, tp)
        self.bf16 = bf16
        self.temperature = temperature if temperature > 0 else 1.0
        self.model = self._build(hf_state_dict)
        self.ref: Any = None
        self.ref_loader = ref_loader
        self.needs_top_k = False
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)
        self.base_lr, self.clip_grad, self.warmup_steps = lr, clip_grad, warmup_steps
        self.micro_batch_size = micro_batch_size
        self.tokenizer_source = tokenizer_source
        self.step = 0

    def _build(self, state_dict: dict[str, Tensor]) -> Any:
        model = convert.build_gpt_model(self.arch)  # float32 weights (the master copy with --bf16)
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
    def _forward(self, model: Any, mb: TrainBatch, *, entropy: bool, top_k: bool) -> ForwardOutput:
        """One micro-batch; values are 0 off ``loss_mask``.

        Raises:
            ValueError: response ids outside the vocabulary at ``loss_mask`` positions.
        """
        v = self.arch.vocab_size
        mask = mb.loss_mask.bool()
        resp = mb.response_ids.long()
        in_range = (resp >= 0) & (resp < v)
        if not in_range[mask].all():
            raise ValueError(f"response token ids outside the vocabulary [0, {v}) at loss_mask positions")
        resp = torch.where(in_range, resp, 0)  # garbage off the mask: any valid id
        ids, pos, at = pack_sequences(mb.prompt_ids, resp)
        s = ids.shape[1]
        causal = torch.triu(torch.ones(s, s, dtype=torch.bool, device=self.device), diagonal=1)[None, None]
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            logits = model(ids.to(self.device), pos.to(self.device), causal)  # [b, S, V/tp]
        at = at.to(self.device)
        picked = logits.gather(1, at.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))  # [b, T, V/tp]
        top_ids = None
        if top_k:
            if "top_k_ids" not in mb.tensors:
                raise KeyError("top-k log-probs asked but the batch has no tensors['top_k_ids']")
            top_ids = mb.tensors["top_k_ids"].to(self.device).long().clamp(0, v - 1)
        lp, ent, top = token_stats(picked, resp.to(self.device), temperature=self.temperature, entropy=entropy,
                                   top_k_ids=top_ids)
        m = mask.to(self.device)
        zero = lambda x: None if x is None else torch.where(m.view(*m.shape, *[1] * (x.dim() - 2)), x, 0.0)  # noqa: E731
        return ForwardOutput(log_probs=zero(lp), entropy=zero(ent), top_k_log_probs=zero(top))

    def _micro_batches(self, batch: TrainBatch) -> list[TrainBatch]:
        n = batch.size
        size = self.micro_batch_size or n
        return [TrainBatch(prompt_ids=batch.prompt_ids[i:i + size], response_ids=batch.response_ids[i:i + size],
                           loss_mask=batch.loss_mask[i:i + size],
                           tensors={k: v[i:i + size] for k, v in batch.tensors.items()})
                for i in range(0, n, size)]

    def forward(self, batch: TrainBatch, *, role: str = "actor", entropy: bool = False,
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
        with torch.no_grad():
            outs = [self._forward(model, mb, entropy=entropy, top_k=top_k) for mb in self._micro_batches(batch)]
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

    def _grad_norm(self) -> float:
        """Global L2 norm of the gradient: TP-sharded parameters summed over the TP group,
        replicated ones (the RMSNorm weights, identical on every rank once the q/k norm
        gradients are summed) counted once.

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

    def lr(self) -> float:
        """Learning rate of the next step: linear warm-up ``lr·(s+1)/W`` for ``s < W``, then ``lr``."""
        w = self.warmup_steps
        return self.base_lr * (min(1.0, (self.step + 1) / w) if w > 0 else 1.0)

    def train_step(self, batch: TrainBatch, loss_fn: Any, *, role: str = "actor") -> dict[str, float]:
        """One AdamW step of the actor over ``batch`` (gradient accumulation over micro-batches).

        ``loss_fn(micro_batch, forward_output) -> (loss, metrics)`` returns the micro-batch's
        loss already scaled by the global denominators, so the accumulated gradient is the
        global batch's.  A micro-batch whose loss is not finite is not backpropagated, and
        the step is skipped when any loss, metric or the gradient norm is not finite.

        Returns:
            the same keys as the torch backend: ``loss`` and each ``loss_fn`` metric summed
            over micro-batches, ``grad_norm`` (before clipping), ``lr``, ``skipped`` (0/1),
            ``micro_batches``, and ``nonfinite/<name>: 1`` for each offender.

        Raises:
            ValueError: ``role`` is not ``actor``.
        """
        if role != "actor":
            raise ValueError(f"megatron backend trains only the actor, not {role!r}")
        entropy = bool(getattr(loss_fn, "needs_entropy", True))
        top_k = bool(getattr(loss_fn, "needs_top_k", self.needs_top_k))
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {"loss": 0.0}
        bad: set[str] = set()
        mbs = self._micro_batches(batch)
        self.model.train()
        try:
            for mb in mbs:
                loss, metrics = loss_fn(mb, self._forward(self.model, mb, entropy=entropy, top_k=top_k))
                value = float(loss.detach())
                sums["loss"] += value
                for k, v in metrics.items():
                    if k != "loss":
                        sums[k] = sums.get(k, 0.0) + float(v)
                    if not math.isfinite(float(v)):
                        bad.add(k)
                if not math.isfinite(value):
                    bad.add("loss")
                elif loss.requires_grad:
                    loss.backward()
        finally:
            self.model.eval()
        self._allreduce_qk_layernorm_grads()
        norm = self._grad_norm()
        if not math.isfinite(norm):
            bad.add("grad_norm")
        lr = self.lr()
        if not bad:
            if self.clip_grad > 0 and norm > self.clip_grad:
                scale = self.clip_grad / (norm + 1e-6)
                for p in self.model.parameters():
                    if p.grad is not None:
                        p.grad.mul_(scale)
            for g in self.optimizer.param_groups:
                g["lr"] = lr
            self.optimizer.step()
            self.step += 1
        self.optimizer.zero_grad(set_to_none=True)
        result = {**sums, "grad_norm": norm, "lr": lr, "skipped": float(bool(bad)), "micro_batches": float(len(mbs))}
        result.update({f"nonfinite/{k}": 1.0 for k in sorted(bad)})
        return result

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
        if self.tokenizer_source is not None:
            load_tokenizer(self.tokenizer_source).save_pretrained(path)

    def save_checkpoint(self, path: str) -> None:
        """This rank's Megatron weights (safetensors) and optimizer state, plus the step
        (rank 0); every TP rank calls it with the same ``path`` (a barrier ends it)."""
        from safetensors.torch import save_file

        r = self.ps.get_tensor_model_parallel_rank()
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in convert.local_state_dict(self.model).items()},
                  str(out / f"megatron_tp{r}.safetensors"))
        torch.save(self.optimizer.state_dict(), out / f"optimizer_tp{r}.pt")
        if r == 0:
            (out / "megatron_backend.json").write_text(json.dumps({"step": self.step}))
        if dist.get_world_size() > 1:
            dist.barrier()

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
        hf.config, hf.state_dict(), tp=config.tensor_parallel_size, lr=config.lr,
        weight_decay=config.weight_decay, clip_grad=config.clip_grad, warmup_steps=config.lr_warmup_steps,
        micro_batch_size=config.micro_batch_size, seed=config.seed, bf16=config.bf16,
        temperature=config.rollout_temperature,
        ref_loader=lambda: load_model(config.ref_load or config.model).state_dict(),
        tokenizer_source=config.model, device=config.device)
