"""Tensor parallel from `relax train`: `--launcher ray --train-backend megatron
--tensor-parallel-size 2 --actor-num-gpus-per-node 2` (two CPU training workers in one gloo
group, one Megatron TP group, one data-parallel replica) trains exactly like the
single-worker TP = 1 run: same metrics step by step (to 1e-5), with no sample counted twice
(both TP ranks train on the same samples; the driver reads one of them)."""

from __future__ import annotations

import importlib.util
import math

import pytest

from relax_core.reporting.metrics import read_metrics
from relax_ray_helpers import ray_args, run_train, trained

pytestmark = pytest.mark.skipif(importlib.util.find_spec("megatron") is None,
                                reason="megatron-core not installed (pip install -e 'plugins/backends/megatron[backend]')")

#: metrics that are timings or counters of the machine, not of the maths
SKIP = ("time", "perf/", "per_s", "ray_", "restarts")


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["--tensor-parallel-size", "--pipeline-parallel-size"])
def test_model_parallel_two_workers_equal_one(parallel, tiny_model_dir, prompts_file, tmp_path, ray_local):
    """Also pipeline parallel: two stages, megatron's 1F1B schedule over gloo, the last
    stage's loss, metrics and log-probs broadcast so that the driver may read either."""
    runs = {}
    for name, extra in (("tp1", ()), ("tp2", (parallel, "2", "--actor-num-gpus-per-node", "2"))):
        # --colocate: the engine shares training bundle 0 (the test cluster has 2 CPUs)
        code, out = run_train(ray_args(tiny_model_dir, prompts_file, tmp_path, name, "--train-backend", "megatron",
                                       "--num-rollout", "2", "--colocate", "--micro-batch-size", "4",
                                       "--use-kl-loss", "--kl-loss-coef", "0.01", "--kl-loss-type", "k3", "--lr", "1e-3",
                                       *extra))
        assert code == 0, out
        runs[name] = (read_metrics(tmp_path / name), trained(tmp_path / name))
    (one, one_log), (two, two_log) = runs["tp1"], runs["tp2"]
    assert [r["step"] for r in two] == [1, 2]
    assert two_log == one_log  # the same samples, groups and weight versions
    assert all(len(r["group_index"]) == 8 for r in two_log)
    keys = [k for k in one[0] if isinstance(one[0][k], (int, float)) and not any(s in k for s in SKIP)]
    for k in ("train/loss", "train/pg_loss", "train/kl_loss", "train/entropy", "train/grad_norm",
              "train/train_rollout_logprob_abs_diff", "rollout/reward"):
        assert k in keys, k
    for a, b in zip(two, one):
        for k in keys:
            assert math.isfinite(b[k]), (b["step"], k)
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-5), (a["step"], k, a[k], b[k])
    assert two[1]["train/kl_loss"] > 0.0  # step 2 trains weights that moved (pushed to the engine from 2 TP shards)
    assert all(r["train/grad_norm"] > 0 for r in two)
