"""What `relax train --resume` continues, from which checkpoint, with which configuration,
and what a fresh start into an existing run directory does (issue 18 items 2-6, 9) — on the
tiny model, through the CLI as a user types it."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import run_train, tiny_args

import relax_core.run.launch as launch_mod
from relax_core.reporting.metrics import read_metrics

KEYS = ("rollout/raw_reward", "rollout/response_len/mean", "train/loss", "train/grad_norm", "train/entropy")


def _same(a: list[dict], b: list[dict]) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b):
        for k in KEYS:
            assert x[k] == pytest.approx(y[k], rel=1e-4, abs=1e-6), (x["step"], k)


def _no_model(monkeypatch) -> None:
    """From now on, fail the test if anything past the checks that need no model runs."""
    def boom(*a, **k):
        raise AssertionError("the run went past the checks that need no model")

    monkeypatch.setattr(launch_mod, "_launch", boom)


def test_resume_after_the_latest_checkpoint_was_removed(tiny_model_dir, prompts_file, tmp_path):
    """The issue's case: 3 steps with --save-interval 1, remove checkpoints/step_000003,
    --resume. Before the fix: "no checkpoint found; starting fresh", metrics.jsonl with steps
    1,2,3,1,2,3 and the intact step_000002 deleted by rotation."""
    args = tiny_args(tiny_model_dir, prompts_file, tmp_path, "--num-rollout", "3", "--save-interval", "1",
                     "--no-save-hf")
    code, out = run_train(args)
    assert code == 0, out
    run = tmp_path / "run"
    first = read_metrics(run)
    shutil.rmtree(run / "checkpoints" / "step_000003")
    code, out = run_train([*args, "--resume"])
    assert code == 0, out
    assert f"resuming run {run} from {run / 'checkpoints' / 'step_000002'} (step 2)" in out
    assert "names step_000003, which is missing; resuming from step_000002, the newest complete checkpoint" in out
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3]
    _same(read_metrics(run), first)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_000002", "step_000003"]


def test_fresh_start_into_an_existing_run_is_refused_unless_forced(tiny_model_dir, prompts_file, tmp_path,
                                                                   monkeypatch):
    args = tiny_args(tiny_model_dir, prompts_file, tmp_path, "--no-save-hf")
    code, out = run_train(args)
    assert code == 0, out
    run = tmp_path / "run"
    before = (run / "metrics.jsonl").read_text()
    with monkeypatch.context() as m:
        _no_model(m)
        code, out = run_train(args)
    assert code == 2
    assert f"{run} already holds a run (metrics.jsonl (2 records); checkpoints in {run / 'checkpoints'}" in out
    assert "continue it with --resume, choose another --run-name, or pass --force" in out
    assert (run / "metrics.jsonl").read_text() == before  # nothing appended
    code, out = run_train([*args, "--force"])
    assert code == 0, out
    assert f"--force: removed the earlier run in {run}" in out
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2


def test_resume_takes_the_saved_config_lists_overrides_and_refuses_a_finished_run(tiny_model_dir, prompts_file,
                                                                                  tmp_path, monkeypatch):
    code, out = run_train(tiny_args(tiny_model_dir, prompts_file, tmp_path, "--no-save-hf"))
    assert code == 0, out
    _no_model(monkeypatch)
    run = tmp_path / "run"
    # finished: --resume alone (every other option from config.json) is refused
    code, out = run_train(["--output-dir", str(tmp_path), "--resume"])
    assert code == 2
    assert (f"run {run} is finished (its newest checkpoint step_000002 is at step 2 and --num-rollout is 2); "
            "to train it further pass a larger --num-rollout, e.g. --num-rollout 4") in out
    # a refused setting, before any model loads
    code, out = run_train(["--output-dir", str(tmp_path), "--resume", "--num-rollout", "3", "--weight-decay", "0.5"])
    assert code == 2
    assert ("--weight-decay 0.0 → 0.5 cannot change on resume (it lives in the optimizer state restored from the "
            f"checkpoint); resume with --weight-decay 0.0 (as saved in {run / 'config.json'}), or start a new run") in out
    code, out = run_train(["--output-dir", str(tmp_path), "--resume", "--num-rollout", "3", "--adam-beta2", "0.9"])
    assert code == 2 and "--adam-beta2 0.999 → 0.9 cannot change on resume" in out
    # ambiguous without --run-name
    other = tmp_path / "other" / "checkpoints"
    shutil.copytree(run / "checkpoints", other)
    code, out = run_train(["--output-dir", str(tmp_path), "--resume", "--num-rollout", "3"])
    assert code == 2 and f"2 runs under {tmp_path} can be resumed (other, run); choose one with --run-name NAME" in out
    code, out = run_train(["--output-dir", str(tmp_path / "empty"), "--resume"])
    assert code == 2 and "no run directory under" in out


def test_resume_grows_a_finished_run_from_its_saved_config(tiny_model_dir, prompts_file, tmp_path):
    """Only --num-rollout and --lr given on resume: model, data, scorer, batch shape come from
    config.json (before the fix the run resumed as a default 20-step run of the default model)."""
    code, out = run_train(tiny_args(tiny_model_dir, prompts_file, tmp_path, "--no-save-hf"))
    assert code == 0, out
    run = tmp_path / "run"
    code, out = run_train(["--output-dir", str(tmp_path), "--run-name", "run", "--resume", "--num-rollout", "3",
                           "--lr", "0.01"])
    assert code == 0, out
    assert f"resuming run {run} from {run / 'checkpoints' / 'step_000002'} (step 2)" in out
    assert "override: --num-rollout 2 → 3 from step 3" in out and "override: --lr 0.001 → 0.01 from step 3" in out
    assert "holds no optimizer state: the optimizer starts afresh at step 3" in out
    recs = read_metrics(run)
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert recs[1]["train/lr"] == pytest.approx(1e-3) and recs[2]["train/lr"] == pytest.approx(1e-2)
    saved = json.loads((run / "config.json").read_text())
    assert saved["model"] == str(tiny_model_dir) and saved["num_rollout"] == 3 and saved["lr"] == 0.01
    assert saved["resume"] is True


def test_resume_with_other_data_is_refused_before_any_model_loads(tiny_model_dir, prompts_file, tmp_path,
                                                                  monkeypatch):
    code, out = run_train(tiny_args(tiny_model_dir, prompts_file, tmp_path, "--no-save-hf"))
    assert code == 0, out
    other = tmp_path / "other.jsonl"  # same size, other labels: before the fix accepted silently
    other.write_text(prompts_file.read_text().replace('"label": "1"', '"label": "2"'))
    resume = ["--output-dir", str(tmp_path), "--run-name", "run", "--resume", "--num-rollout", "3", "--data", str(other)]
    with monkeypatch.context() as m:
        _no_model(m)
        code, out = run_train(resume)
    assert code == 2
    assert "--resume: the training data differ from those of" in out
    assert "same row count (8) but other rows" in out and "--resume-allow-data-change" in out
    fewer = tmp_path / "fewer.jsonl"  # other size: before the fix a traceback and exit 1 after the model loaded
    fewer.write_text("".join(prompts_file.read_text().splitlines(keepends=True)[:5]))
    with monkeypatch.context() as m:
        _no_model(m)
        code, out = run_train([*resume[:-1], str(fewer)])
    assert code == 2, out
    assert f"8 rows in the checkpoint ({prompts_file}), 5 now ({fewer})" in out, out
    code, out = run_train([*resume, "--resume-allow-data-change"])
    assert code == 0, out
    assert "--resume-allow-data-change: training data changed" in out
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2, 3]


def test_dry_run_reads_the_data(tiny_model_dir, tmp_path):
    """Before the fix a malformed JSONL line passed --dry-run with "valid": true (item 9)."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "label": "1"}\n{"prompt": "b", "label": "2",, "x": 1}\n')
    code, out = run_train([*tiny_args(tiny_model_dir, bad, tmp_path), "--dry-run"])
    assert code == 2
    assert f"{bad}:2: invalid JSON: Expecting property name enclosed in double quotes (line 2, column 30)" in out
    assert '"valid": true' not in out
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "a", "label": "1"}\n')
    code, out = run_train([*tiny_args(tiny_model_dir, good, tmp_path), "--dry-run"])
    assert code == 0 and '"valid": true' in out
    assert not (tmp_path / "run").exists()  # a dry run writes nothing
