"""A checkpoint write that fails (ENOSPC in the writer): the run stops with one clear line
and exit code 5, the previous checkpoint is intact, and `--resume` continues from it to the
metrics of an uninterrupted run (issue 18 fault suite)."""

from __future__ import annotations

import errno

import pytest
from fault_helpers import assert_same_metrics, run_train, tiny_args

from relax_core.reporting.metrics import read_metrics
from relax_core.run import checkpoint as ckpt


@pytest.mark.slow
def test_disk_full_while_checkpointing_stops_cleanly_and_resumes(tiny_model_dir, prompts_file, tmp_path,
                                                                  monkeypatch):
    import safetensors.torch

    ref_args = tiny_args(tiny_model_dir, prompts_file, tmp_path / "ref", "--num-rollout", "3")
    code, out = run_train(ref_args)
    assert code == 0, out

    args = tiny_args(tiny_model_dir, prompts_file, tmp_path / "b", "--num-rollout", "3", "--save-interval", "1")
    real = safetensors.torch.save_file

    def full_disk(tensors, filename, *a, **k):  # every safetensors write of the step-2 checkpoint fails
        if "step_000002.tmp" in str(filename):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(tensors, filename, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(safetensors.torch, "save_file", full_disk)
        code, out = run_train(args)
    root = tmp_path / "b" / "run" / "checkpoints"
    assert code == 5, out
    assert (f"relax: error: [Errno 28] writing checkpoint {root / 'step_000002'} failed: No space left on device "
            f"(OSError); the previous checkpoint {root / 'step_000001'} is intact; free space or fix the directory, "
            "then continue with --resume") in out
    assert "Traceback" not in out
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001"]
    assert ckpt.is_complete(root / "step_000001")

    code, out = run_train([*args, "--resume"])
    assert code == 0, out
    assert "resumed from step 1" in out
    assert_same_metrics(read_metrics(tmp_path / "b" / "run"), read_metrics(tmp_path / "ref" / "run"))
