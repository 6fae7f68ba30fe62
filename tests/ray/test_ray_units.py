"""Fast checks of the Ray launcher's pieces that need no cluster: sharding, seeds,
staleness metrics, the config round trip to workers, and validation of Ray runs."""

from __future__ import annotations

import pytest
import torch

from relax_core.config import build_config, config_to_dict
from relax_core.distributed.proxies import chunk_seed, data_parallel_layout, split_even
from relax_core.distributed.workers import config_from_dict, loss_recipe
from relax_core.host.plugins import default_registry
from relax_core.stages.rollout import staleness_metrics


@pytest.mark.parametrize("n,parts", [(8, 2), (7, 3), (2, 4), (0, 2)])
def test_split_even_covers_every_sample_once(n, parts):
    r = split_even(n, parts)
    assert len(r) == parts and r[0][0] == 0 and r[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(r, r[1:]))  # consecutive, no gap, no overlap
    sizes = [hi - lo for lo, hi in r]
    assert max(sizes) - min(sizes) <= 1


def test_chunk_seeds_keep_the_step_seed_for_one_engine_and_differ_per_chunk():
    assert chunk_seed(1234, 0) == 1234 and chunk_seed(None, 3) is None
    assert len({chunk_seed(1234, i) for i in range(8)}) == 8


def test_staleness_metrics_hand_values():
    # trained at step 5: versions 4 (fresh), 3, 2 -> staleness 0, 1, 2
    m = staleness_metrics(torch.tensor([4, 3, 2, 4]), 5)
    assert m == {"staleness/mean": pytest.approx(0.75), "staleness/max": 2.0}
    assert staleness_metrics(torch.tensor([], dtype=torch.long), 3) == {"staleness/mean": 0.0, "staleness/max": 0.0}


def test_workers_rebuild_the_drivers_config():
    reg = default_registry()
    cfg = build_config(cli={"advantage_estimator": "m2po", "m2po.kl2_budget": 0.07, "correction": ("tis",),
                            "launcher": "ray", "max_staleness": 2, "fully_async": True, "rollout_stop": ("\n\n",)},
                       param_schemas=reg.param_schemas())
    back = config_from_dict(config_to_dict(cfg))
    assert back == cfg
    assert back.params_for("m2po").kl2_budget == 0.07


def test_only_core_losses_travel_by_recipe():
    with pytest.raises(TypeError, match="ActorLoss/CriticLoss"):
        loss_recipe(lambda mb, out: (0.0, {}))


def _train(args):
    from typer.testing import CliRunner

    from cli.main import app

    return CliRunner().invoke(app, ["train", *args])


def test_dry_run_validates_ray_defaults():
    res = _train(["--dry-run", "--launcher", "ray"])
    assert res.exit_code == 0, res.output


def test_sync_only_estimator_is_refused_in_fully_async_mode():
    res = _train(["--dry-run", "--launcher", "ray", "--advantage-estimator", "rloo", "--fully-async"])
    assert res.exit_code == 2
    assert "rloo is sync-only" in res.output and "rloo does not support --fully-async" in res.output


def test_fully_async_needs_the_ray_launcher():
    res = _train(["--dry-run", "--fully-async"])
    assert res.exit_code == 2 and "add --launcher ray" in res.output


def test_ray_resource_flags_need_the_ray_launcher():
    res = _train(["--dry-run", "--rollout-num-engines", "2", "--colocate"])
    assert res.exit_code == 2
    assert "--colocate, --rollout-num-engines only take effect with --launcher ray" in res.output
    assert _train(["--dry-run", "--rollout-num-engines", "2", "--colocate", "--launcher", "ray"]).exit_code == 0


@pytest.mark.parametrize("layout,want", [
    ([(0, 1)], (1, [0])),
    ([(0, 1), (0, 1)], (1, [0, 0])),                  # TP = 2: one replica
    ([(0, 2), (0, 2), (1, 2), (1, 2)], (2, [0, 0, 1, 1])),  # TP = 2, DP = 2 (Megatron's order)
    ([(0, 2), (1, 2), (0, 2), (1, 2)], (2, [0, 1, 0, 1])),  # any order: shards follow dp_rank
])
def test_data_parallel_layout(layout, want):
    assert data_parallel_layout(layout) == want


@pytest.mark.parametrize("layout", [[], [(0, 2), (0, 1)], [(0, 2), (0, 2), (0, 2), (1, 2)], [(0, 2), (2, 2)],
                                    [(0, 2), (0, 2), (0, 2)], [(0, 0)]])
def test_inconsistent_data_parallel_layout_is_refused(layout):
    with pytest.raises(ValueError, match="inconsistent data-parallel layout"):
        data_parallel_layout(layout)


def test_data_parallel_size_counts_model_parallel_ranks():
    cfg = build_config(cli={"launcher": "ray", "actor_num_nodes": 2, "actor_num_gpus_per_node": 4,
                            "tensor_parallel_size": 2, "context_parallel_size": 2})
    assert (cfg.training_workers, cfg.model_parallel_size, cfg.data_parallel_size) == (8, 4, 2)
    local = build_config(cli={"tensor_parallel_size": 2})
    assert (local.training_workers, local.model_parallel_size, local.data_parallel_size) == (1, 2, 1)


SIZES = "--tensor-parallel-size × --context-parallel-size × --pipeline-parallel-size = 2×1×1"
BATCH = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "8"]  # 32 samples per step


@pytest.mark.parametrize("args,message,fix", [
    (["--tensor-parallel-size", "2"],
     f"model-parallel size 2 ({SIZES}) needs 2 training processes, but --launcher local starts one",
     "use --launcher ray --actor-num-gpus-per-node 2 (one training worker per model-parallel rank), "
     "or set the parallel sizes to 1"),
    (["--launcher", "ray", "--tensor-parallel-size", "2", "--actor-num-gpus-per-node", "3"],
     f"3 training workers (--actor-num-nodes 1 × --actor-num-gpus-per-node 3) are not a multiple of the "
     f"model-parallel size 2 ({SIZES})",
     "make --actor-num-nodes × --actor-num-gpus-per-node a multiple of 2 (e.g. --actor-num-gpus-per-node 2), "
     "or lower the parallel sizes"),
    (["--launcher", "ray", "--tensor-parallel-size", "2", "--actor-num-gpus-per-node", "6"],
     "--global-batch-size 32 is not divisible by the 3 data-parallel replicas (6 training workers / "
     "model-parallel size 2)",
     "choose a global batch size divisible by (--actor-num-nodes × --actor-num-gpus-per-node) / "
     "(--tensor-parallel-size × --context-parallel-size × --pipeline-parallel-size)"),
    (["--launcher", "ray", "--tensor-parallel-size", "2", "--actor-num-gpus-per-node", "4", "--micro-batch-size", "3"],
     "each training worker's share of the global batch (32 / 2 = 16 samples) is not divisible by "
     "--micro-batch-size 3", "choose a micro-batch size that divides global_batch_size / data-parallel replicas"),
])
def test_batch_shape_counts_model_parallel_ranks(args, message, fix):
    """Dry runs: DP = training workers / (TP × CP × PP); the worker count must be a multiple
    of TP × CP × PP (flags and fix named)."""
    from relax_core.host.validation import resolve

    res = _train(["--dry-run", "--train-backend", "megatron", *BATCH, *args])
    assert res.exit_code == 2, res.output
    assert f"[batch shape]: {message}" in " ".join(res.output.split()), res.output
    cli = {"train_backend": "megatron", "rollout_batch_size": 4, "n_samples_per_prompt": 8}
    for flag, value in zip(args[::2], args[1::2]):
        cli[flag.removeprefix("--").replace("-", "_")] = value if flag == "--launcher" else int(value)
    _, problems = resolve(build_config(cli=cli, param_schemas=default_registry().param_schemas()), default_registry())
    assert [(p.message, p.fix) for p in problems if p.constraint == "batch shape"] == [(message, fix)]


def test_tensor_parallel_megatron_over_ray_passes_validation():
    args = ["--dry-run", "--train-backend", "megatron", *BATCH, "--tensor-parallel-size", "2"]
    assert _train([*args, "--launcher", "ray", "--actor-num-gpus-per-node", "2"]).exit_code == 0
    res = _train([*args, "--launcher", "ray", "--actor-num-gpus-per-node", "4"])  # 2 replicas: no DP in megatron
    assert res.exit_code == 2
    assert "megatron cannot train data-parallel over 2 replicas (4 training workers / model-parallel size 2)" in \
        " ".join(res.output.split())
    res = _train([*args[:-2], "--launcher", "ray", "--actor-num-gpus-per-node", "2"])  # no TP: 2 replicas
    assert res.exit_code == 2 and "cannot train data-parallel over 2 replicas" in " ".join(res.output.split())


def test_driver_loss_sums_the_replicas_metric_contributions():
    from relax_core.stages.loss import ActorLoss, CriticLoss, LossSettings

    settings = LossSettings.from_config(build_config(cli={}), "ppo_clip")
    for loss in (ActorLoss(None, [], settings, num_tokens=10.0, num_samples=4.0, old_from_current=False),
                 CriticLoss(None, settings, num_tokens=10.0, num_samples=4.0)):
        loss.add_metrics({"train/loss": 1.5, "train/pg_clipfrac": 0.25})
        loss.add_metrics({"train/loss": -0.5, "train/pg_clipfrac": 0.125})
        assert loss.metrics() == {"train/loss": 1.0, "train/pg_clipfrac": 0.375}
