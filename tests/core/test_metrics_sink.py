"""relax_core.reporting.metrics: JSONL records (non-finite values kept as strings); the display is
tested in test_progress.py."""

from __future__ import annotations

import json
import math

from relax_core.config import RunConfig
from relax_core.reporting.metrics import MetricsLogger, read_metrics, rewrite_metrics


def test_jsonl_records_and_last_record_per_step_wins(tmp_path):
    log = MetricsLogger(tmp_path, RunConfig(quiet=True, num_rollout=3), {})
    log.log(1, {"rollout/raw_reward": 0.5, "train/loss": math.nan})
    log.log(2, {"rollout/raw_reward": 0.75})
    log.log(2, {"rollout/raw_reward": 0.8})
    log.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[0] == {"step": 1, "rollout/raw_reward": 0.5, "train/loss": "nan"}
    assert [r["rollout/raw_reward"] for r in read_metrics(tmp_path)] == [0.5, 0.8]
    rewrite_metrics(tmp_path, read_metrics(tmp_path)[:1])
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]
