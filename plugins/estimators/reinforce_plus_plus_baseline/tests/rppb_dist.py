"""Rank function of ``test_reinforce_plus_plus_baseline.py``'s 2-process gloo test (spawned
by torch.multiprocessing, so it lives in a module the children import by name)."""

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
        from relax_core import DualClipParams
        from relax_core.contracts import AdvantageInput
        from relax_reinforce_plus_plus_baseline.reinforce_plus_plus_baseline import build

        out = build(DualClipParams(), None).compute_advantages(AdvantageInput(**shard(whole_batch(), rank),
                                                                  process_group=dist.group.WORLD))
        torch.save({"advantages": out.advantages, "returns": out.returns, "metrics": out.metrics},
                   f"{tmpdir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def whole_batch() -> dict:
    """4 groups of 3 (group ids interleaved, not by position), variable lengths, one
    unscored sample, one empty response, garbage nowhere needed (no token inputs)."""
    g = torch.Generator().manual_seed(3)
    B, T = 12, 7
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[5] = 0
    mask = torch.arange(T)[None, :] < lengths[:, None]
    rewards = torch.randint(0, 3, (B,), generator=g).float()
    rewards[7] = NAN
    group_index = torch.tensor([10, 11, 10, 11, 10, 11, 12, 13, 12, 13, 12, 13])
    return dict(rewards=rewards, group_index=group_index, loss_mask=mask)


def shard(batch: dict, rank: int) -> dict:
    """Rank 0 holds groups 10 and 11 (rows 0..5), rank 1 groups 12 and 13 (rows 6..11)."""
    rows = slice(0, 6) if rank == 0 else slice(6, 12)
    return {k: v[rows] for k, v in batch.items()}
