"""A multi-turn environment over `--launcher ray` (tiny model; sync, and fully async with the
episodes in environment worker processes): episodes with several
turns train, and the weight version that sampled each episode is recorded.  Weights reach
the engine only between steps (the rollout holds the publisher's lock through a step's whole
generation, every turn of every episode), so an episode's turns share one version: the
sample's ``weight_version``, its staleness that of its oldest (and every) turn."""

from __future__ import annotations

import json

import pytest

from relax_core.reporting.metrics import read_metrics
from relax_ray_helpers import ray_args, run_train, trained


@pytest.mark.slow
def test_retry_over_ray_records_each_episodes_weight_version(tiny_model_dir, prompts_file, tmp_path, ray_local):
    # a random model almost never samples EOS: the stop string "e" ends its turns, so that
    # wrong answers (vowel-fraction scores below 1) get feedback and another turn
    code, out = run_train(ray_args(tiny_model_dir, prompts_file, tmp_path, "retry", "--environment", "retry",
                                   "--max-turns", "3", "--rollout-stop", "e"))
    assert code == 0, out
    run = tmp_path / "retry"
    recs = read_metrics(run)
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    assert max(r["rollout/num_turns/max"] for r in recs) > 1 and recs[0]["rollout/env_token_frac"] > 0
    assert all(r["rollout/env_errors"] == 0 and r["rollout/env_timeouts"] == 0 for r in recs)
    log = trained(run)
    # sync: step s's episodes were sampled by the weights after step s - 1, every turn of them
    assert [v for r in log for v in r["weight_version"]] == [r["step"] - 1 for r in log for _ in r["weight_version"]]
    assert all(r["staleness/max"] == 0.0 for r in recs)
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert any(s.get("num_turns", 1) > 1 for s in samples)


@pytest.mark.slow
def test_retry_fully_async_with_environment_workers_keeps_the_staleness_bound(tiny_model_dir, prompts_file, tmp_path,
                                                                              ray_local):
    """--fully-async --max-staleness 1 with the episodes in environment worker processes: the
    rollout thread runs multi-turn episodes ahead of the trainer, each sample at most one
    version old, none lost to the workers."""
    code, out = run_train(ray_args(tiny_model_dir, prompts_file, tmp_path, "retry-async", "--environment", "retry",
                                   "--max-turns", "3", "--rollout-stop", "e", "--fully-async", "--max-staleness", "1",
                                   "--env-isolation", "process"))
    assert code == 0, out
    run = tmp_path / "retry-async"
    recs = read_metrics(run)
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    assert max(r["rollout/num_turns/max"] for r in recs) > 1
    assert all(r["rollout/env_errors"] == 0 and r["rollout/env_timeouts"] == 0 for r in recs)
    assert not any("rollout/env_restarts" in r for r in recs)
    staleness = [r["step"] - 1 - v for r in trained(run) for v in r["weight_version"]]
    assert len(staleness) == 4 * 8 and min(staleness) >= 0 and max(staleness) == 1, staleness  # it ran ahead
    assert max(r["staleness/max"] for r in recs) == max(staleness)
