"""SIGKILL the trainer at 10 seeded points, half of them inside a checkpoint write, resume
after each, and compare the final metrics and weights with an uninterrupted run: equal
(synchronous loop, --update-weights-interval 1; issue 18 item 3 and fault suite).  A kill
inside a write must leave the previous complete checkpoint, which the next --resume finds
even when `latest` was not yet replaced."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest
from fault_helpers import FAULTS, ROOT, assert_same_metrics, tiny_args

from relax_core import checkpoint as ckpt
from relax_core.metrics import read_metrics

STEPS = 10
KILLS = 10


def _args(model, data, out, *extra):
    args = tiny_args(model, data, out, "--num-rollout", str(STEPS), "--save-interval", "1", *extra)
    args.remove("--no-save-hf")
    return args


def _start(args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(FAULTS), env.get("PYTHONPATH", "")])
    return subprocess.Popen([sys.executable, "-m", "cli.main", "train", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _lines(path):
    return len(path.read_text().splitlines()) if path.is_file() else 0


@pytest.mark.slow
def test_sigkill_at_ten_points_then_resume_equals_uninterrupted_run(tiny_model_dir, prompts_file, tmp_path):
    from safetensors.torch import load_file
    import torch

    ref = subprocess.run([sys.executable, "-m", "cli.main", "train",
                          *_args(tiny_model_dir, prompts_file, tmp_path / "ref")], cwd=ROOT, capture_output=True,
                         text=True, timeout=900,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(FAULTS)])})
    assert ref.returncode == 0, ref.stderr[-3000:]

    out = tmp_path / "killed"
    run, root = out / "run", out / "run" / "checkpoints"
    rng = random.Random(0)
    kills, in_write = 0, 0
    while kills < KILLS:
        done = ckpt.latest_checkpoint(root)
        k = 0 if done is None else int(done.name.split("_")[1])
        proc = _start(_args(tiny_model_dir, prompts_file, out, *(["--resume"] if kills else [])))
        inside = kills % 2 == 0 and kills > 0  # the first launch has no checkpoint to protect yet
        delay = rng.uniform(0.0, 0.4)
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            if inside and root.is_dir() and any(p.name.endswith(".tmp") for p in root.iterdir()):
                break  # a checkpoint is being written: kill it now
            if not inside and _lines(run / "metrics.jsonl") > k:
                time.sleep(delay)  # a seeded moment after the next step finished
                break
            time.sleep(0.002)
        if proc.poll() is not None:
            pytest.fail(f"the run ended on its own (code {proc.returncode}) before kill {kills + 1}")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        kills += 1
        # the kill landed inside the write when its half-written step_N.tmp is left behind
        in_write += inside and any(p.name.endswith(".tmp") for p in root.iterdir())
        assert ckpt.latest_checkpoint(root) is not None or kills == 1
    assert in_write >= 3, in_write

    final = subprocess.run([sys.executable, "-m", "cli.main", "train",
                            *_args(tiny_model_dir, prompts_file, out, "--resume")], cwd=ROOT, capture_output=True,
                           text=True, timeout=900,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(FAULTS)])})
    assert final.returncode == 0, final.stderr[-3000:]
    assert [r["step"] for r in read_metrics(run)] == list(range(1, STEPS + 1))
    assert_same_metrics(read_metrics(run), read_metrics(tmp_path / "ref" / "run"))
    wa, wb = load_file(str(tmp_path / "ref" / "run" / "final" / "model.safetensors")), \
        load_file(str(run / "final" / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=1e-5, atol=1e-6)
