"""Checkpoint writes are atomic and resume finds the newest complete checkpoint (issue 18
item 3; issue 19 §6 retention): a write that fails or is killed at any point leaves the
previous complete checkpoint, a missing or truncated checkpoint is skipped with a note,
and rotation never removes the last complete checkpoint before its successor is complete."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch

from relax_core.run import checkpoint as ckpt


class Backend:
    """Writes ``weights.safetensors`` (and ``optim.json``); ``fail`` raises inside the write."""

    def __init__(self, fail: BaseException | None = None):
        self.fail = fail
        self.w = torch.arange(4.0)

    def save_checkpoint(self, path: str, include_optimizer: bool = True) -> None:
        from safetensors.torch import save_file

        Path(path).mkdir(parents=True)
        save_file({"w": self.w}, f"{path}/weights.safetensors")
        if self.fail is not None:
            raise self.fail
        if include_optimizer:
            Path(path, "optim.json").write_text("{}")

    def load_checkpoint(self, path: str) -> None:
        from safetensors.torch import load_file

        self.w = load_file(f"{path}/weights.safetensors")["w"]


def save(root, step, backend=None, keep=2, **kw):
    return ckpt.save_checkpoint(root, step, backend or Backend(), {"step": step}, keep=keep, **kw)


def names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_rotation_keeps_the_newest_complete_checkpoints(tmp_path):
    for step in (1, 2, 3):
        save(tmp_path, step)
    assert names(tmp_path) == ["latest", "step_000002", "step_000003"]
    assert (tmp_path / "latest").read_text() == "step_000003"
    assert all(ckpt.is_complete(tmp_path / n) for n in ("step_000002", "step_000003"))
    save(tmp_path, 4, keep=1)
    assert names(tmp_path) == ["latest", "step_000004"]


def test_resume_falls_back_to_the_newest_complete_checkpoint_and_says_so(tmp_path):
    """The issue's case: `latest` names step 3, which was removed; before the fix resume
    said "no checkpoint found; starting fresh" and rotation then deleted step 2."""
    for step in (1, 2, 3):
        save(tmp_path, step)
    import shutil

    shutil.rmtree(tmp_path / "step_000003")
    path, note = ckpt.resume_checkpoint(tmp_path)
    assert path == tmp_path / "step_000002"
    assert note == (f"{tmp_path / 'latest'} names step_000003, which is missing; resuming from step_000002, "
                    "the newest complete checkpoint")
    save(tmp_path, 3)  # the resumed run saves step 3 again: step 2 is kept
    assert names(tmp_path) == ["latest", "step_000002", "step_000003"]


def test_a_truncated_or_incomplete_checkpoint_is_not_complete(tmp_path):
    save(tmp_path, 1)
    save(tmp_path, 2)
    w = tmp_path / "step_000002" / "backend" / "weights.safetensors"
    w.write_bytes(w.read_bytes()[:10])
    assert not ckpt.is_complete(tmp_path / "step_000002")
    path, note = ckpt.resume_checkpoint(tmp_path)
    assert path == tmp_path / "step_000001" and "step_000002, which is incomplete" in note
    (tmp_path / "step_000001" / "rng.json").unlink()
    assert ckpt.resume_checkpoint(tmp_path)[0] is None


def test_a_checkpoint_from_before_manifests_is_resumable(tmp_path):
    save(tmp_path, 1)
    (tmp_path / "step_000001" / ckpt.MANIFEST).unlink()  # as the previous version wrote it
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_000001"
    (tmp_path / "step_000001" / "trainer_state.json").unlink()
    assert ckpt.latest_checkpoint(tmp_path) is None


@pytest.mark.parametrize("keep", [1, 2])
def test_a_failing_write_leaves_the_previous_checkpoint_intact(tmp_path, keep):
    save(tmp_path, 1, keep=keep)
    before = names(tmp_path)
    with pytest.raises(ckpt.CheckpointError) as e:
        save(tmp_path, 2, Backend(OSError(errno.ENOSPC, "No space left on device")), keep=keep)
    assert str(e.value) == (f"[Errno 28] writing checkpoint {tmp_path / 'step_000002'} failed: No space left on "
                            f"device (OSError); the previous checkpoint {tmp_path / 'step_000001'} is intact")
    assert names(tmp_path) == before  # no step_000002.tmp left behind
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_000001"


def test_saving_the_same_step_again_swaps_only_a_complete_successor(tmp_path):
    """Before the fix the old copy was deleted before the new one was renamed in: a crash
    in between left `latest` pointing at nothing."""
    save(tmp_path, 1, keep=1)
    with pytest.raises(KeyboardInterrupt):  # killed (second Ctrl-C) while writing the same step again
        save(tmp_path, 1, Backend(KeyboardInterrupt()), keep=1)
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_000001"
    save(tmp_path, 1, keep=1, include_optimizer=False)
    assert names(tmp_path) == ["latest", "step_000001"]  # the .tmp and .old are gone
    state = json.loads((tmp_path / "step_000001" / "trainer_state.json").read_text())
    assert state["optimizer_state"] is False
    assert not (tmp_path / "step_000001" / "backend" / "optim.json").exists()


def test_a_save_killed_between_its_two_renames_is_recovered(tmp_path):
    save(tmp_path, 1, keep=1)
    (tmp_path / "step_000001").rename(tmp_path / "step_000001.old")  # the state after the first rename
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_000001.old"


def test_holds_checkpoints_and_disk_usage(tmp_path):
    assert not ckpt.holds_checkpoints(tmp_path / "none") and ckpt.run_disk_usage(tmp_path / "none") == 0
    (tmp_path / "step_000001.tmp").mkdir()
    assert ckpt.holds_checkpoints(tmp_path)
    (tmp_path / "f").write_bytes(b"x" * 1500)
    assert ckpt.run_disk_usage(tmp_path) == 1500 and ckpt.format_size(1500) == "1.5 kB"
    assert ckpt.format_size(999) == "999 B" and ckpt.format_size(2_100_000_000) == "2.1 GB"


def test_convert_hf_dtype_halves_the_final_model(tiny_model_dir, tmp_path):
    import shutil

    from transformers import AutoModelForCausalLM

    final = tmp_path / "final"
    shutil.copytree(tiny_model_dir, final)
    size = (final / "model.safetensors").stat().st_size
    ckpt.convert_hf_dtype(final, torch.bfloat16)
    assert (final / "model.safetensors").stat().st_size < 0.51 * size
    model = AutoModelForCausalLM.from_pretrained(final)
    assert json.loads((final / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert next(model.parameters()).dtype == torch.bfloat16
