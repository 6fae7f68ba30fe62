"""Data parallel over torch.distributed (2 gloo ranks on CPU, float64): each rank trains on
half of the batch with the global denominators; the summed gradients, the reported norm
and the stepped weights equal one process on the whole batch."""

import os

import pytest
import torch
import torch.multiprocessing as mp

from relax_torch_test_helpers import PGLoss, make_backend, make_batch, train_step


def _half(batch, rank, world):
    n = batch.size // world
    return batch.slice(rank * n, (rank + 1) * n)


def _worker(rank, world, init_file, model_dir, out_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        batch = make_batch(seed=11, b=6)
        fn = PGLoss(float(batch.loss_mask.sum()))  # global denominator
        be = make_backend(model_dir, lr=0.01, micro_batch_size=2)
        acc = be.accumulate_gradients(_half(batch, rank, world), fn)
        grads = {k: p.grad.clone() for k, p in be.models["actor"].named_parameters()}
        loss = torch.tensor([acc.sums["loss"]], dtype=torch.float64)
        dist.all_reduce(loss)
        m = train_step(be, _half(batch, rank, world), fn)
        torch.save({"grads": grads, "loss": float(loss), "grad_norm": m.grad_norm,
                    "weights": be.models["actor"].state_dict()}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_equal_one_process(tiny_model_dir, tmp_path):
    world = 2
    mp.start_processes(_worker, args=(world, str(tmp_path / "init"), str(tiny_model_dir), str(tmp_path)),
                       nprocs=world, join=True, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world)]

    batch = make_batch(seed=11, b=6)
    fn = PGLoss(float(batch.loss_mask.sum()))
    be = make_backend(tiny_model_dir, lr=0.01)
    acc = be.accumulate_gradients(batch, fn)
    want = {k: p.grad.clone() for k, p in be.models["actor"].named_parameters()}
    m = train_step(be, batch, fn)
    for r in ranks:
        assert r["loss"] == pytest.approx(acc.sums["loss"], abs=1e-12)
        for k in want:
            torch.testing.assert_close(r["grads"][k], want[k], atol=1e-12, rtol=1e-9, msg=k)
        assert r["grad_norm"] == pytest.approx(m.grad_norm, rel=1e-10)
        for k, v in be.models["actor"].state_dict().items():
            torch.testing.assert_close(r["weights"][k], v, atol=1e-12, rtol=0, msg=k)


def test_split_to_count_splits_the_largest_ranges_in_order():
    from relax_torch.backend import split_to_count

    assert split_to_count([(0, 5), (5, 6)], 2) == [(0, 5), (5, 6)]
    assert split_to_count([(0, 5), (5, 6)], 3) == [(0, 3), (3, 5), (5, 6)]
    assert split_to_count([(0, 4)], 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert split_to_count([], 0) == split_to_count([], 3) == []
    # fewer samples than the count (uneven data-parallel shares): one micro-batch per sample
    assert split_to_count([(0, 2)], 3) == [(0, 1), (1, 2)]


class CollectiveLoss(PGLoss):
    """PGLoss plus an all-reduce per micro-batch (as m2po's global statistic does)."""

    def __call__(self, mb, out):
        import torch.distributed as dist

        n = torch.tensor([float(mb.loss_mask.sum())])
        dist.all_reduce(n)
        return super().__call__(mb, out)


def _packed_worker(rank, world, init_file, model_dir, out_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        batch = make_batch(seed=11, b=4)
        if rank == 1:  # one-token prompts and responses: fewer packed micro-batches than rank 0
            mask = torch.zeros_like(batch.loss_mask)
            mask[:, 0] = True
            batch = type(batch)(prompt_ids=[[5]] * 4, response_ids=torch.where(mask, 7, 10**9), loss_mask=mask,
                                advantages=torch.ones(4, 6, dtype=torch.float64), top_k_ids=batch.top_k_ids)
        be = make_backend(model_dir, lr=0.01, max_tokens_per_micro_batch=14)
        local = len(be.micro_batches(batch))
        acc = be.accumulate_gradients(batch, CollectiveLoss(100.0))
        torch.save({"local": local, "ran": acc.micro_batches}, os.path.join(out_dir, f"packed{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_token_packed_ranks_run_the_same_number_of_micro_batches(tiny_model_dir, tmp_path):
    """Without equal counts the rank with fewer micro-batches would leave the other waiting
    in its per-micro-batch collective forever."""
    world = 2
    mp.start_processes(_packed_worker, args=(world, str(tmp_path / "init"), str(tiny_model_dir), str(tmp_path)),
                       nprocs=world, join=True, start_method="spawn")
    r0, r1 = (torch.load(tmp_path / f"packed{r}.pt", weights_only=True) for r in range(world))
    assert r0["local"] > r1["local"]  # the setup really differs
    assert r0["ran"] == r1["ran"] == r0["local"]
