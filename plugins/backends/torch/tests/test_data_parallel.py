"""Data parallel over torch.distributed (2 gloo ranks on CPU, float64): each rank trains on
half of the batch with the global denominators; the summed gradients, the reported norm
and the stepped weights equal one process on the whole batch."""

import os

import pytest
import torch
import torch.multiprocessing as mp

from relax_torch_test_helpers import PGLoss, make_backend, make_batch


def _half(batch, rank, world):
    from relax_torch.backend import _slice

    n = batch.size // world
    return _slice(batch, rank * n, (rank + 1) * n)


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
        loss = torch.tensor([acc["sums"]["loss"]], dtype=torch.float64)
        dist.all_reduce(loss)
        m = be.train_step(_half(batch, rank, world), fn)
        torch.save({"grads": grads, "loss": float(loss), "metrics": m,
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
    m = be.train_step(batch, fn)
    for r in ranks:
        assert r["loss"] == pytest.approx(acc["sums"]["loss"], abs=1e-12)
        for k in want:
            torch.testing.assert_close(r["grads"][k], want[k], atol=1e-12, rtol=1e-9, msg=k)
        assert r["metrics"]["grad_norm"] == pytest.approx(m["grad_norm"], rel=1e-10)
        for k, v in be.models["actor"].state_dict().items():
            torch.testing.assert_close(r["weights"][k], v, atol=1e-12, rtol=0, msg=k)
