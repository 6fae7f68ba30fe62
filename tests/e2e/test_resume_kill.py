"""SIGKILL mid-run, then `--resume`: the run continues from the last checkpoint, repeats no
prompt, and ends with the same metrics and model as an uninterrupted run with the same seed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import E2E, ROOT, tiny_args

from relax_core.reporting.metrics import read_metrics

STEPS = 6


def _cmd(model, data, out, *extra):
    return [sys.executable, "-m", "cli.main", "train",
            *tiny_args(model, data, out, "--num-rollout", str(STEPS), "--lr", "1e-2"), *extra]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(E2E), env.get("PYTHONPATH", "")])
    return env


def _weights(run: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run / "final" / "model.safetensors"))


@pytest.mark.slow
def test_sigkill_then_resume_equals_uninterrupted_run(tiny_model_dir, prompts_file, tmp_path):
    a = subprocess.run(_cmd(tiny_model_dir, prompts_file, tmp_path / "a"), cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=900)
    assert a.returncode == 0, a.stderr[-3000:]

    b_out = tmp_path / "b"
    proc = subprocess.Popen(_cmd(tiny_model_dir, prompts_file, b_out, "--save-interval", "1"), cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = b_out / "run" / "checkpoints" / "latest"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and proc.poll() is None:
        if latest.is_file() and latest.read_text().strip() == "step_000002":
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    killed_at = int(latest.read_text().strip().split("_")[1])
    assert killed_at < STEPS
    assert not (b_out / "run" / "final").exists()

    c = subprocess.run(_cmd(tiny_model_dir, prompts_file, b_out, "--save-interval", "1", "--resume"), cwd=ROOT,
                       env=_env(), capture_output=True, text=True, timeout=900)
    assert c.returncode == 0, c.stderr[-3000:]
    assert f"resumed from step {killed_at}" in c.stdout + c.stderr

    ma, mb = read_metrics(tmp_path / "a" / "run"), read_metrics(b_out / "run")
    assert [m["step"] for m in mb] == list(range(1, STEPS + 1))
    for x, y in zip(ma, mb):
        for k in ("rollout/raw_reward", "rollout/response_len/mean", "train/loss", "train/pg_loss", "train/grad_norm",
                  "train/entropy"):
            assert x[k] == pytest.approx(y[k], rel=1e-4, abs=1e-6), (x["step"], k, x[k], y[k])
    wa, wb = _weights(tmp_path / "a" / "run"), _weights(b_out / "run")
    assert wa.keys() == wb.keys()
    import torch

    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6)
