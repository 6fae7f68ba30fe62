"""relax_core.reporting.metrics: JSONL records (non-finite values kept as strings); the display is
tested in test_progress.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

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


def test_peak_rss_is_the_processs_and_rises_with_what_it_touches():
    """In a process started by this (large) test process: the peak is at least the resident
    size /proc reports and not the parent's (ru_maxrss would be: it survives execve), and
    touching 256 MiB more raises it by about that."""
    code = textwrap.dedent("""
        from relax_core.reporting.metrics import peak_rss_gib
        def vm_rss_gib():
            line = next(x for x in open("/proc/self/status") if x.startswith("VmRSS:"))
            return int(line.split()[1]) / 2**20
        before, now = peak_rss_gib(), vm_rss_gib()
        block = b"\x01" * (256 * 2**20)  # written: every page touched (calloc would leave them unmapped)
        print(before, now, peak_rss_gib())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    before, now, after = map(float, out.stdout.split())
    assert now * 0.999 <= before < now + 0.05
    assert 0.24 <= after - before <= 0.27
