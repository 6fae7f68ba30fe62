"""Worker processes for the pipeline- and context-parallel tests (spawned with
``torch.multiprocessing``, one per rank, like :mod:`mp_workers`)."""

from __future__ import annotations

import os

import torch
from mp_workers import TEMPERATURE, ToyLoss, tiny_batch, tiny_hf, train_step


class MetricLoss(ToyLoss):
    """:class:`ToyLoss` that also keeps ``metrics()`` (the sum of its micro-batch losses
    and masked token counts) and takes ``add_metrics`` like :class:`relax_core.stages.loss.ActorLoss`."""

    def __init__(self, num_tokens: float, nan: bool = False):
        super().__init__(num_tokens, nan)
        self.sums: dict[str, float] = {}

    def __call__(self, mb, out):
        loss, metrics = super().__call__(mb, out)
        self.add_metrics({"train/toy_loss": float(loss.detach()), "train/tokens": float(mb.loss_mask.sum())})
        return loss, metrics

    def metrics(self) -> dict[str, float]:
        return dict(self.sums)

    def add_metrics(self, contributions: dict[str, float]) -> None:
        for k, v in contributions.items():
            self.sums[k] = self.sums.get(k, 0.0) + v


def _env(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)


def pp_worker(rank: int, world: int, port: int, kind: str, out_path: str) -> None:
    """PP = ``world`` (1 or 2) on a tiny ``kind`` model: a no-grad forward (entropy, top-k),
    a skipped (NaN) step, a real step, a checkpoint round trip, the reference; micro-batches
    of 3 samples for the batch of 4 (so one is padded).  Every rank saves its results."""
    _env(rank, world, port)
    from relax_megatron.backend import MegatronBackend

    hf = tiny_hf(kind)
    batch = tiny_batch()
    be = MegatronBackend(hf.config, hf.state_dict(), pp=world, micro_batch_size=3,
                         temperature=TEMPERATURE, ref_loader=lambda: tiny_hf(kind).state_dict())
    be.setup(needs_ref=True)
    n = float(batch.loss_mask.sum())
    fwd = be.forward(batch, entropy=True, top_k=True)
    before = be.engine_state_dict()
    skipped = train_step(be, batch, MetricLoss(n, nan=True))
    unchanged = max((be.engine_state_dict()[k] - before[k]).abs().max().item() for k in before)
    loss = MetricLoss(n)
    stepped = train_step(be, batch, loss)
    after = be.engine_state_dict()
    ckpt = out_path + ".ckpt"
    be.save_checkpoint(ckpt)
    train_step(be, batch, MetricLoss(n))
    moved_again = max((be.engine_state_dict()[k] - after[k]).abs().max().item() for k in after)
    be.load_checkpoint(ckpt)
    restored = max((be.engine_state_dict()[k] - after[k]).abs().max().item() for k in after)
    res = {"log_probs": fwd.log_probs, "entropy": fwd.entropy, "top_k": fwd.top_k_log_probs, "before": before,
           "skipped": skipped, "unchanged": unchanged, "stepped": stepped, "metrics": loss.metrics(), "after": after,
           "ckpt": (moved_again, restored, be.step), "ref_log_probs": be.forward(batch, role="ref").log_probs,
           "actor_after": be.forward(batch).log_probs}
    bf16 = MegatronBackend(hf.config, hf.state_dict(), pp=world, micro_batch_size=3, temperature=TEMPERATURE, bf16=True)
    res["bf16_log_probs"] = bf16.forward(batch).log_probs  # stages exchange bfloat16 hidden states
    torch.save(res, f"{out_path}.rank{rank}")


def cp_gather_worker(rank: int, world: int, port: int, out_path: str) -> None:
    """CP = ``world`` over gloo: each rank splits the same ``[b, S]`` values with
    :func:`cp_split`, places them at the response tokens it holds, and :func:`group_sum`
    gathers the full layout; then the gradient of a loss of the gathered tensor, summed over
    ranks (as the backend's all-reduce does), is compared with the one-process gradient."""
    _env(rank, world, port)
    import torch.distributed as dist

    from relax_megatron.parallel import allreduce_grads, cp_positions, cp_split, group_sum, local_index

    dist.init_process_group("gloo")
    g = torch.Generator().manual_seed(0)
    b, s = 3, 12
    at = torch.tensor([[2, 3, 4, 5, 6], [5, 6, 7, 8, 9], [6, 7, 8, 9, 10]])  # [b, T] predicting positions
    w = torch.randn(s, generator=g)
    weight = torch.nn.Parameter(torch.randn(b, s, generator=g))

    def per_position(p: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:  # a position-wise "model"
        return torch.tanh(p) * w[positions]  # [b, S_local]

    held = cp_positions(s, world, rank)
    local = per_position(cp_split(weight, world, rank), held)  # [b, S/cp]
    index, inside = local_index(at, held, s)
    tok = group_sum(torch.where(inside, local.gather(1, index), 0.0), dist.group.WORLD)  # [b, T]
    seq_loss = (tok.sum(1) ** 2).mean()  # needs whole sequences (as GSPO's sequence ratio does)
    seq_loss.backward()
    allreduce_grads([weight], dist.group.WORLD)
    from megatron.core.utils import get_batch_on_this_cp_rank  # Megatron's own split, same group

    megatron_split = get_batch_on_this_cp_rank({"tokens": weight.detach().clone()}, dist.group.WORLD)["tokens"]
    torch.save({"megatron_split": megatron_split, "split": cp_split(weight.detach(), world, rank), "tok": tok.detach(), "loss": seq_loss.item(), "grad": weight.grad.clone(), "held": held,
                "full": per_position(weight, torch.arange(s)).gather(1, at).detach(), "weight": weight.detach(),
                "w": w, "at": at}, f"{out_path}.rank{rank}")
    dist.destroy_process_group()


class SeqLoss(MetricLoss):
    """A sequence-level loss (each sample's summed log-prob, squared, averaged): a token's
    gradient depends on its whole response, as with GSPO's sequence ratio."""

    def __call__(self, mb, out):
        lp = torch.where(mb.loss_mask, out.log_probs, 0.0)
        ent = torch.where(mb.loss_mask, out.entropy, 0.0)
        loss = ((lp.sum(1) ** 2).sum() - 0.01 * ent.sum()) / self.n
        self.add_metrics({"train/toy_loss": float(loss.detach()), "train/tokens": float(mb.loss_mask.sum())})
        return loss, {}


def cp_backend_worker(rank: int, world: int, port: int, out_path: str) -> None:
    """The backend's context-parallel path with CP = ``world`` over gloo, the attention
    emulated: Transformer Engine's is CUDA-only, so the model is a stand-in that gathers the
    ranks' chunks, runs a transformers model on the whole sequence and returns this rank's
    positions' logits (what TE's ring attention computes), each rank holding a replica.
    Everything else is the backend's own: padding to 2·CP, the chunks, the statistics of
    the held tokens gathered to ``[B, T]``, the loss, the CP gradient all-reduce, AdamW."""
    _env(rank, world, port)
    import torch.distributed as dist

    import relax_megatron.backend as backend
    from relax_megatron.parallel import cp_positions

    hf = tiny_hf("qwen2")

    class FullSequence(torch.nn.Module):
        post_process = True

        def __init__(self) -> None:
            super().__init__()
            self.hf = hf

        def forward(self, ids, pos, mask):
            from megatron.core import parallel_state as ps

            cp, r = ps.get_context_parallel_world_size(), ps.get_context_parallel_rank()
            parts = [torch.empty_like(ids) for _ in range(cp)]
            dist.all_gather(parts, ids, group=ps.get_context_parallel_group())
            s = ids.shape[1] * cp
            full = torch.empty(ids.shape[0], s, dtype=ids.dtype)
            for q, part in enumerate(parts):
                full[:, cp_positions(s, cp, q) if cp > 1 else torch.arange(s)] = part
            logits = self.hf(full).logits  # [b, S, V]
            return logits[:, cp_positions(s, cp, r)] if cp > 1 else logits

    backend.context_parallel_problem = lambda cp, cuda: None  # no TE here: the stand-in attends
    backend.MegatronBackend._build = lambda self, sd: FullSequence()
    be = backend.MegatronBackend(hf.config, hf.state_dict(), cp=world, micro_batch_size=3,
                                 temperature=TEMPERATURE)
    batch = tiny_batch()
    fwd = be.forward(batch, entropy=True, top_k=True)
    loss = SeqLoss(float(batch.loss_mask.sum()))
    stepped = train_step(be, batch, loss)
    torch.save({"log_probs": fwd.log_probs, "entropy": fwd.entropy, "top_k": fwd.top_k_log_probs, "stepped": stepped,
                "metrics": loss.metrics(), "after": {k: v.detach().clone() for k, v in hf.state_dict().items()},
                "before": tiny_hf("qwen2").state_dict()}, f"{out_path}.rank{rank}")
