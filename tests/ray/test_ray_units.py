"""Fast checks of the Ray launcher's pieces that need no cluster: sharding, seeds,
staleness metrics, the config round trip to workers, and validation of Ray runs."""

from __future__ import annotations

import pytest
import torch

from relax_core.config import build_config, config_to_dict
from relax_core.distributed.driver import staleness_metrics
from relax_core.distributed.proxies import chunk_seed, split_even
from relax_core.distributed.workers import config_from_dict, loss_recipe
from relax_core.plugins import default_registry


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
