"""The default run evaluates on its own held-out prompts (issue 19 §3): before the first
step, every --eval-interval steps and after the last; the summary and the plot show it."""

from __future__ import annotations

import re

from conftest import run_train

from cli.plot import default_metrics, load_runs
from relax_core.config import DEFAULT_DATA, DEFAULT_EVAL_DATA, RunConfig
from relax_core.host.plugins import default_registry
from relax_core.host.validation import resolve
from relax_core.reporting.metrics import read_metrics
from relax_core.run.launch import preflight


def test_eval_source_follows_the_default_task():
    assert RunConfig().eval_source == DEFAULT_EVAL_DATA
    assert RunConfig(data="mine.jsonl").eval_source is None
    assert RunConfig(eval_data="none").eval_source is None
    assert RunConfig(eval_interval=0).eval_source is None
    assert RunConfig(data="mine.jsonl", eval_data="test.jsonl").eval_source == "test.jsonl"
    assert DEFAULT_EVAL_DATA.split("?")[0] == DEFAULT_DATA.split("?")[0]
    # a run saved with the earlier default task keeps its evaluation set (resume, relax eval)
    old = "rg:chain_sum?size=2000&seed=42&min_terms=2&max_terms=2&min_digits=1&max_digits=1"
    assert RunConfig(data=old).eval_source == "rg:chain_sum?size=64&seed=7&min_terms=2&max_terms=2&min_digits=1&max_digits=1"


def _checked(**kw):
    cfg = RunConfig(**kw)
    reg = default_registry()
    resolved, problems = resolve(cfg, reg)
    assert not problems
    return preflight(cfg, resolved, reg)


def test_the_default_evaluation_prompts_never_occur_in_training(tmp_path):
    """Sums and differences of two terms of one or two digits: the 300 evaluation rows hold
    255 distinct problems (the one-digit pairs, 200 problems in all, recur often), and the
    540 of the 2000 training rows that repeat one of those are left out: 1460 rows over
    1058 other problems."""
    a, b = _checked(output_dir=str(tmp_path)), _checked(output_dir=str(tmp_path))
    train, ev = a.train_data, a.eval_data
    held = {r["prompt"] for r in ev.rows}
    assert len(ev) == 300 and len(held) == 255
    assert not held & {r["prompt"] for r in train.rows}
    assert (len(train), train.held_out, len({r["prompt"] for r in train.rows})) == (1460, 540, 1058)
    assert a.notes == ["540 of 2000 training rows left out: their prompt is an evaluation prompt "
                       "(--no-exclude-eval-prompts keeps them)"]
    assert train.fingerprint == b.train_data.fingerprint  # the same rows on every start
    kept = _checked(output_dir=str(tmp_path), exclude_eval_prompts=False)
    assert (len(kept.train_data), kept.train_data.held_out, kept.notes) == (2000, 0, [])


def test_default_task_evaluates_at_start_interval_and_end(tiny_model_dir, tmp_path):
    code, out = run_train(["--model", str(tiny_model_dir), "--output-dir", str(tmp_path), "--run-name", "run",
                           "--num-rollout", "3", "--eval-interval", "2", "--eval-max-prompts", "4",
                           "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "8",
                           "--quiet", "--no-save-hf", "--reward-num-workers", "1"])
    assert code == 0, out
    recs = read_metrics(tmp_path / "run")
    evaluated = [r["step"] for r in recs if "eval/chain_sum/pass@1" in r]
    assert evaluated == [0, 2, 3]
    assert re.search(r"held-out chain_sum +pass@1 \d+% → best \d+% → last \d+% \(steps 0, \d, 3\)", out), out
    assert "held-out evaluation before step 1: " in out
    assert "eval/chain_sum/pass@1" in default_metrics(load_runs([tmp_path / "run"]))
