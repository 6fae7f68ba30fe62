"""The end-of-run summary (issue 19 §2): steps, wall time, reward first → last and first
quarter → last quarter, held-out first → best → last with steps, where the files are, the
plot command, and the run's size on disk."""

import json
import re

from relax_core.reporting.summary import summary_lines


def _run(tmp_path, n=8):
    run = tmp_path / "grpo-x"
    (run / "checkpoints" / f"step_{n:06d}").mkdir(parents=True)
    for name in ("trainer_state.json", "rng.json", "rng_torch.safetensors"):  # a complete checkpoint's state files
        (run / "checkpoints" / f"step_{n:06d}" / name).write_text("{}")
    (run / "checkpoints" / f"step_{n:06d}" / "model.safetensors").write_bytes(b"0" * 1500)
    (run / "checkpoints" / "latest").write_text(f"step_{n:06d}")
    (run / "final").mkdir()
    records = [{"step": 0, "eval/chain_sum/pass@1": 0.21}]
    records += [{"step": s, "rollout/raw_reward": s / 10} for s in range(1, n + 1)]
    records[min(4, n)]["eval/chain_sum/pass@1"] = 0.54
    records[-1]["eval/chain_sum/pass@1"] = 0.42
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "samples.jsonl").write_text("{}\n")
    return run


def test_summary_of_a_finished_run(tmp_path):
    run = _run(tmp_path)
    lines = summary_lines(run, total=8, wall_s=258.0)
    text = "\n".join(re.sub(r" {2,}", "  ", line) for line in lines)
    assert lines[0] == "relax: done: 8 of 8 steps in 4:18"
    assert "reward  0.100 → 0.800  (first-quarter mean 0.150 → last 0.750)" in text
    assert "held-out chain_sum  pass@1 21% → best 54% → last 42% (steps 0, 4, 8)" in text
    for label, path in (("metrics", run / "metrics.jsonl"), ("samples", run / "samples.jsonl"),
                        ("checkpoint", run / "checkpoints" / "step_000008"), ("final model", run / "final")):
        assert any(line.split()[0] == label.split()[0] and line.endswith(str(path)) for line in lines), (label, text)
    assert any(line.strip().startswith("plot") and line.endswith(f"relax plot {run}") for line in lines), text
    assert any(line.strip().startswith("size on disk") and line.endswith(" kB") for line in lines), text


def test_summary_lines_other_than_paths_fit_80_columns(tmp_path):
    """An 80-column terminal shows each figure line whole (they were 86-94 wide)."""
    lines = summary_lines(_run(tmp_path, n=20), total=20, wall_s=3600.0)
    figures = [x for x in lines if x.split()[0] in ("relax:", "reward", "held-out", "size")]
    assert len(figures) == 4 and max(map(len, figures)) <= 80, figures


def test_summary_of_an_interrupted_run_says_stopped(tmp_path):
    assert summary_lines(_run(tmp_path, n=3), total=20, wall_s=5)[0] == "relax: stopped: 3 of 20 steps in 0:05"

