"""Disk use of a run (issue 19 §6): --keep-checkpoints, the final checkpoint of a completed
run without optimizer state (an interrupted run keeps it), --save-hf-dtype bfloat16, and the
run's size printed at the end."""

from __future__ import annotations

import json

import torch
from conftest import run_train, tiny_args

from relax_core.run.checkpoint import format_size, run_disk_usage


def test_retention_optimizer_free_final_checkpoint_bf16_model_and_size(tiny_model_dir, prompts_file, tmp_path):
    from transformers import AutoModelForCausalLM

    code, out = run_train(tiny_args(tiny_model_dir, prompts_file, tmp_path, "--num-rollout", "3", "--save-interval",
                                    "1", "--keep-checkpoints", "1", "--save-hf-dtype", "bfloat16"))
    assert code == 0, out
    run = tmp_path / "run"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_000003"]
    final_ckpt = run / "checkpoints" / "step_000003"
    assert json.loads((final_ckpt / "trainer_state.json").read_text())["optimizer_state"] is False
    assert sorted(p.name for p in (final_ckpt / "backend").iterdir()) == ["actor.safetensors", "backend_state.json"]
    model = AutoModelForCausalLM.from_pretrained(run / "final")
    assert next(model.parameters()).dtype == torch.bfloat16
    line = [x.split() for x in out.splitlines() if x.strip().startswith("size on disk")]  # the end-of-run summary
    assert line == [["size", "on", "disk", *format_size(run_disk_usage(run)).split()]]


def test_an_interrupted_run_keeps_the_optimizer_state(tiny_model_dir, prompts_file, tmp_path, monkeypatch):
    from relax_core.trainer import Trainer

    step = Trainer.step

    def interrupt_after_one(self, k):  # as the first Ctrl-C does, during step 1
        self._interrupted = True
        return step(self, k)

    monkeypatch.setattr(Trainer, "step", interrupt_after_one)
    code, out = run_train(tiny_args(tiny_model_dir, prompts_file, tmp_path, "--no-save-hf"))
    assert code == 130, out
    ckpt = tmp_path / "run" / "checkpoints" / "step_000001"
    assert json.loads((ckpt / "trainer_state.json").read_text())["optimizer_state"] is True
    assert (ckpt / "backend" / "actor_optim.safetensors").is_file()
