"""Rank function of ``test_reinforce_plus_plus.py``'s 2-process gloo test (spawned by
torch.multiprocessing, so it lives in a module the children import by name)."""

from __future__ import annotations

import torch
import torch.distributed as dist

NAN = float("nan")


def spawn(world: int, tmpdir: str) -> list[dict]:
    import torch.multiprocessing as mp

    mp.spawn(_entry, args=(world, tmpdir), nprocs=world, join=True)
    return [torch.load(f"{tmpdir}/rank{r}.pt", weights_only=True) for r in range(world)]


def _entry(rank: int, world: int, tmpdir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmpdir}/init", rank=rank, world_size=world)
    try:
        torch.save(advantages_on_rank(rank, dist.group.WORLD), f"{tmpdir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def whole_batch() -> dict:
    """A batch with holes, an empty response, an unscored sample and garbage at masked slots."""
    g = torch.Generator().manual_seed(11)
    B, T = 6, 9
    mask = torch.rand(B, T, generator=g) < 0.75
    mask[2] = False  # empty response
    old = -torch.rand(B, T, generator=g) * 3
    ref = -torch.rand(B, T, generator=g) * 3
    old = torch.where(mask, old, torch.full_like(old, NAN))
    ref = torch.where(mask, ref, torch.full_like(ref, 1e9))
    rewards = torch.randn(B, generator=g)
    rewards[4] = NAN  # unscored
    return dict(rewards=rewards, group_index=torch.arange(B), loss_mask=mask, old_log_probs=old, ref_log_probs=ref)


def batch_with_empty_rank() -> dict:
    """:func:`whole_batch` with nothing to train on in rows 3..5 (rank 1's shard)."""
    b = whole_batch()
    b["loss_mask"] = b["loss_mask"].clone()
    b["loss_mask"][3:5] = False
    b["rewards"] = b["rewards"].clone()
    b["rewards"][5] = NAN
    return b


def shard(batch: dict, rank: int) -> dict:
    """Rank 0 holds rows 0..2 (with the empty response), rank 1 rows 3..5."""
    rows = slice(0, 3) if rank == 0 else slice(3, 6)
    return {k: v[rows] for k, v in batch.items()}


def build():
    from relax_core.config import RunConfig
    from relax_reinforce_plus_plus.plugin import ReinforcePlusPlusParams
    from relax_reinforce_plus_plus.reinforce_plus_plus import build as build_rpp

    return build_rpp(ReinforcePlusPlusParams(gamma=0.9), RunConfig(kl_coef=0.05))


def advantages_on_rank(rank: int, group) -> dict:
    from relax_core.contracts import AdvantageInput

    out = build().compute_advantages(AdvantageInput(**shard(whole_batch(), rank), process_group=group))
    res = {"advantages": out.advantages, "returns": out.returns, "metrics": out.metrics}
    # rank 1 without a valid token (empty responses, an unscored sample) still joins
    out = build().compute_advantages(AdvantageInput(**shard(batch_with_empty_rank(), rank), process_group=group))
    res["empty_rank_advantages"] = out.advantages
    # a rank whose mask is all empty still joins; a globally empty batch raises on every rank
    empty = dict(rewards=torch.tensor([1.0]), group_index=torch.tensor([0]),
                 loss_mask=torch.zeros(1, 3, dtype=torch.bool), old_log_probs=torch.zeros(1, 3),
                 ref_log_probs=torch.zeros(1, 3))
    try:
        build().compute_advantages(AdvantageInput(**empty, process_group=group))
        res["global_empty"] = "no error"
    except ValueError as e:
        res["global_empty"] = str(e)
    return res
