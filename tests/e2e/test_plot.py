"""relax plot: PNG of metrics against step, several runs overlaid."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from relax_core.plotting import plot_runs


def _run(path, rewards):
    path.mkdir(parents=True)
    recs = [{"step": i + 1, "rollout/raw_reward": r, "rollout/response_len/mean": 10 + i, "train/loss": 0.1 * i,
             "train/ppo_kl": "nan" if i == 1 else 0.01} for i, r in enumerate(rewards)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_overlays_runs_into_one_png(tmp_path):
    a, b = _run(tmp_path / "grpo", [0.1, 0.2, 0.4]), _run(tmp_path / "rloo", [0.1, 0.3, 0.3])
    out = plot_runs([a, b], out=tmp_path / "cmp.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    # default path, and a KL panel falling back to ppo_kl when no kl_loss was logged
    assert plot_runs([a]) == a / "metrics.png"


def test_unknown_metric_and_missing_run_are_clear_errors(tmp_path):
    a = _run(tmp_path / "a", [0.1])
    with pytest.raises(ValueError, match="logged metrics: rollout/raw_reward"):
        plot_runs([a], metrics=["train/nope"])
    with pytest.raises(FileNotFoundError, match="relax run directory"):
        plot_runs([tmp_path / "missing"])


def test_cli(tmp_path):
    from cli.main import app

    a = _run(tmp_path / "a", [0.1, 0.2])
    res = CliRunner().invoke(app, ["plot", str(a), "--metric", "rollout/raw_reward", "--out", str(tmp_path / "x.png")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "x.png").is_file()
