"""Rank functions of ``test_normalize.py``'s 2-process gloo test (spawned by
torch.multiprocessing, so they live in a module the children import by name)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from relax_core.numerics import masked_normalize

NAN = float("nan")


def spawn(world: int, fn: str, tmpdir: str) -> list[dict]:
    """Run ``fn(rank)`` of this module on ``world`` gloo ranks; return each rank's dict."""
    import torch.multiprocessing as mp

    mp.spawn(_entry, args=(world, fn, tmpdir), nprocs=world, join=True)
    return [torch.load(f"{tmpdir}/rank{r}.pt", weights_only=True) for r in range(world)]


def _entry(rank: int, world: int, fn: str, tmpdir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmpdir}/init", rank=rank, world_size=world)
    try:
        torch.save(globals()[fn](rank), f"{tmpdir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def shard_rows(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed random batch with garbage at masked slots and an all-masked row; rank r holds
    rows r, r+2, ... (the parent recomputes the whole batch in one process)."""
    v, m = whole_batch()
    return v[rank::2], m[rank::2]


def whole_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    v = torch.randn(5, 6, generator=g) * 3 + 1
    m = torch.rand(5, 6, generator=g) < 0.7
    m[3] = False
    v = torch.where(m, v, torch.full_like(v, 1e9))
    v[3, 0] = NAN
    return v, m


def cases(rank: int) -> dict:
    g = dist.group.WORLD
    out: dict = {}
    # the pinned example: rank 0 [1, 1e4 (masked), 3], rank 1 [-1, 5]
    if rank == 0:
        v, m = torch.tensor([[1.0, 1e4, 3.0]]), torch.tensor([[True, False, True]])
    else:
        v, m = torch.tensor([[-1.0, 5.0]]), torch.tensor([[True, True]])
    out["pinned"], s = masked_normalize(v, m, group=g)
    out["pinned_stats"] = torch.tensor([s["mean"], s["var"], s["count"]], dtype=torch.float64)
    # a rank without a valid token joins the collectives
    if rank == 0:
        v, m = torch.tensor([[2.0, 4.0]]), torch.tensor([[True, True]])
    else:
        v, m = torch.tensor([[NAN, 7.0]]), torch.tensor([[False, False]])
    out["empty_rank"], s = masked_normalize(v, m, group=g)
    out["empty_rank_stats"] = torch.tensor([s["mean"], s["var"], s["count"]], dtype=torch.float64)
    # globally empty: every rank raises
    try:
        masked_normalize(torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.bool), group=g)
        out["global_empty"] = "no error"
    except ValueError as e:
        out["global_empty"] = str(e)
    # sharding invariance on a random batch, float32 and float64
    v, m = shard_rows(rank)
    out["sharded"], _ = masked_normalize(v, m, group=g)
    out["sharded64"], _ = masked_normalize(v.double(), m, group=g)
    return out
