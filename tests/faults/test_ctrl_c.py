"""Ctrl-C as a terminal sends it (SIGINT to the whole process group of a real `relax train`
subprocess, reward workers included), then `--resume`: equal to an uninterrupted run
(issue 18 item 7).  Before the fix the SIGINT killed the reward worker mid-batch: two
KeyboardInterrupt tracebacks, the finishing step trained on unscored samples, and the
resumed run diverged."""

from __future__ import annotations

import pytest
from fault_helpers import assert_same_metrics, relax_subprocess, tiny_args

from relax_core.reporting.metrics import read_metrics
from relax_core.run import checkpoint as ckpt

STEPS = 4
SCORER = ("--custom-rm-path", "fault_scorers:ctrl_c", "--num-rollout", str(STEPS))


@pytest.fixture(scope="module")
def reference(tiny_model_dir, prompts_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    res = relax_subprocess(tiny_args(tiny_model_dir, prompts_file, out, *SCORER))
    assert res.returncode == 0, res.stderr[-3000:]
    return read_metrics(out / "run")


@pytest.mark.slow
def test_ctrl_c_finishes_the_step_with_every_sample_scored_and_resume_equals_uninterrupted(
        reference, tiny_model_dir, prompts_file, tmp_path):
    args = tiny_args(tiny_model_dir, prompts_file, tmp_path, *SCORER)
    # the 12th sample of the run is the 4th of step 2: Ctrl-C while step 2 is being scored
    res = relax_subprocess(args, env={"RELAX_FAULT_AT": "12", "RELAX_FAULT_DIR": str(tmp_path)})
    assert res.returncode == 130, res.stderr[-3000:]
    assert "interrupted: checkpoint saved to" in res.stderr
    assert "Traceback" not in res.stderr and "KeyboardInterrupt" not in res.stderr, res.stderr[-3000:]
    recs = read_metrics(tmp_path / "run")
    assert [r["step"] for r in recs] == [1, 2]
    assert all(r["rollout/reward_errors"] == 0.0 for r in recs), recs
    assert ckpt.latest_checkpoint(tmp_path / "run" / "checkpoints").name == "step_000002"

    res = relax_subprocess([*args, "--resume"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resumed from step 2" in res.stderr
    assert_same_metrics(read_metrics(tmp_path / "run"), reference)


@pytest.mark.slow
def test_a_second_ctrl_c_aborts_in_one_line_and_keeps_the_last_complete_checkpoint(
        reference, tiny_model_dir, prompts_file, tmp_path):
    args = tiny_args(tiny_model_dir, prompts_file, tmp_path, *SCORER, "--save-interval", "1")
    # two Ctrl-C while step 3 is being scored (samples 19 and 22 of the run)
    res = relax_subprocess(args, env={"RELAX_FAULT_AT": "19,22", "RELAX_FAULT_DIR": str(tmp_path)})
    assert res.returncode == 130, res.stderr[-3000:]
    last = tmp_path / "run" / "checkpoints" / "step_000002"
    lines = [x for x in res.stderr.splitlines() if x.startswith("relax: aborted")]
    assert lines == [f"relax: aborted by Ctrl-C; the last complete checkpoint is {last} (continue with --resume)"]
    assert "Traceback" not in res.stderr and "KeyboardInterrupt" not in res.stderr, res.stderr[-3000:]
    assert ckpt.is_complete(last) and ckpt.latest_checkpoint(last.parent) == last

    res = relax_subprocess([*args, "--resume"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert_same_metrics(read_metrics(tmp_path / "run"), reference)


@pytest.mark.slow
def test_ctrl_c_with_environment_workers_finishes_the_step_and_resumes(tiny_model_dir, prompts_file, tmp_path):
    """The same Ctrl-C with --env-isolation process: the environment's worker processes are in
    the process group too; they ignore the SIGINT (no traceback, no episode lost), the step
    finishes, and --resume equals an uninterrupted run."""
    env = ("--environment", "retry", "--max-turns", "2", "--rollout-stop", "e", "--env-isolation", "process")
    ref = tmp_path / "uninterrupted"
    res = relax_subprocess(tiny_args(tiny_model_dir, prompts_file, ref, *SCORER, *env))
    assert res.returncode == 0, res.stderr[-3000:]
    args = tiny_args(tiny_model_dir, prompts_file, tmp_path / "cut", *SCORER, *env)
    res = relax_subprocess(args, env={"RELAX_FAULT_AT": "12", "RELAX_FAULT_DIR": str(tmp_path)})
    assert res.returncode == 130, res.stderr[-3000:]
    assert "interrupted: checkpoint saved to" in res.stderr
    assert "Traceback" not in res.stderr and "KeyboardInterrupt" not in res.stderr, res.stderr[-3000:]
    recs = read_metrics(tmp_path / "cut" / "run")
    assert 1 <= len(recs) < STEPS
    assert all(r["rollout/env_errors"] == 0.0 and r["rollout/env_timeouts"] == 0.0 for r in recs), recs
    res = relax_subprocess([*args, "--resume"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert_same_metrics(read_metrics(tmp_path / "cut" / "run"), read_metrics(ref / "run"))
