"""relax_core.metrics: JSONL records (non-finite values kept as strings), the live display
and the plain log line."""

from __future__ import annotations

import json
import math

from relax_core.config import RunConfig
from relax_core.metrics import MetricsLogger, format_line, read_metrics, rewrite_metrics


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


def test_live_display_and_plain_line(tmp_path, capsys):
    log = MetricsLogger(tmp_path, RunConfig(quiet=False, num_rollout=2), {})
    log.log(1, {"rollout/raw_reward": 0.25, "train/loss": 0.125, "perf/rollout_tokens_per_s": 100.0})
    log.message("hello")
    log.close()
    line = format_line(1, 2, {"rollout/raw_reward": 0.25, "train/pg_clipfrac": 0.5, "train/skipped_steps": 1.0})
    assert line == "step 1/2 | reward 0.250 | clipfrac 0.500 | skipped 1"
