"""Checkpoints: everything needed to continue a run exactly where it stopped.

Layout (``--save``, default ``<run dir>/checkpoints``)::

    step_000012/
        backend/             model + optimizer + scheduler (the backend's own format)
        trainer_state.json   step, data cursor and fingerprint, skipped steps, metrics so far,
                             the weight version the engine holds
        engine.safetensors   the engine's weights, only when they lag the trainer's
                             (--update-weights-interval > 1, saved between two pushes)
        rng.json             python and numpy RNG states
        rng_torch.safetensors  torch CPU (and CUDA) RNG states
        manifest.json        every file above with its size; written last
    latest                   name of the newest complete checkpoint

Writes are atomic: a checkpoint is written into ``step_N.tmp``, every file and directory is
fsynced, ``manifest.json`` is written last, and only then is the directory renamed to
``step_N`` and ``latest`` replaced (itself written to a temporary name, fsynced, renamed).
A checkpoint is *complete* when its manifest is there and every file it lists has the
listed size.  Saving a step that already has a checkpoint moves the old one aside
(``step_N.old``) only once the new one is complete, and removes it after ``latest`` names
the new one; older checkpoints are rotated out (``--keep-checkpoints``) only after their
successor is complete.  A process killed (or a disk that fills up) at any point therefore
leaves the previous complete checkpoint in place, and :func:`resume_checkpoint` finds the
newest complete one even when ``latest`` names one that is gone.

Only safetensors and JSON are read back (no pickles).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

LATEST = "latest"
ENGINE_WEIGHTS = "engine.safetensors"


MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"step_(\d+)(\.old)?$")


class CheckpointError(OSError):
    """A checkpoint could not be written (disk full, permissions, I/O error); the message
    names the previous complete checkpoint, which is intact."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file: fsync, rename, fsync the
    directory, so that ``path`` holds either the old or the new text after a crash."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _seal(directory: Path) -> None:
    """fsync every file and directory under ``directory``, then write (and fsync) its
    manifest: the relative path and size of every file."""
    files: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(directory):
        for name in filenames:
            p = Path(dirpath) / name
            with p.open("rb") as fh:
                os.fsync(fh.fileno())
            files[str(p.relative_to(directory))] = p.stat().st_size
        _fsync_dir(Path(dirpath))
    _atomic_write(directory / MANIFEST, json.dumps({"files": files}, indent=1))


def is_complete(path: Path) -> bool:
    """Whether ``path`` is a complete checkpoint: its manifest is readable and every file
    it lists exists with the listed size (a checkpoint whose files were deleted or
    truncated is not).  A checkpoint written before manifests existed (relax-core 0.x
    renamed only complete directories) counts when its state files are there."""
    if not (Path(path) / MANIFEST).exists():
        return all((Path(path) / name).is_file() for name in ("trainer_state.json", "rng.json", "rng_torch.safetensors"))
    try:
        files = json.loads((Path(path) / MANIFEST).read_text())["files"]
        return "trainer_state.json" in files and all(
            (Path(path) / rel).stat().st_size == size for rel, size in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _step_of(path: Path) -> int:
    return int(_STEP_DIR.match(path.name).group(1))


def complete_checkpoints(root: Path) -> list[Path]:
    """The complete checkpoints under ``root``, oldest step first (a ``step_N.old`` left by
    a save killed between its two renames counts when ``step_N`` is not complete)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found: dict[int, Path] = {}
    for p in sorted(root.iterdir()):
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and is_complete(p):
            step = int(m.group(1))
            if step not in found or not m.group(2):  # prefer step_N over step_N.old
                found[step] = p
    return [found[k] for k in sorted(found)]


def holds_checkpoints(root: Path) -> bool:
    """Whether ``root`` holds any checkpoint directory, complete or not (``latest``, or a
    ``step_N``, ``step_N.old`` or ``step_N.tmp`` directory)."""
    root = Path(root)
    return root.is_dir() and ((root / LATEST).exists() or any(
        p.is_dir() and re.match(r"step_\d+", p.name) for p in root.iterdir()))


def rng_state() -> tuple[dict, dict[str, torch.Tensor]]:
    """Python and numpy states as JSON, torch states as tensors."""
    version, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    js = {"python": [version, list(mt), gauss],
          "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]}
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    return js, tensors


def set_rng_state(js: dict, tensors: dict[str, torch.Tensor]) -> None:
    version, mt, gauss = js["python"]
    random.setstate((version, tuple(mt), gauss))
    name, keys, pos, has_gauss, cached = js["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("torch_cuda_")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def save_checkpoint(root: Path, step: int, backend: Any, trainer_state: dict, keep: int = 2,
                    include_optimizer: bool = True, engine_weights: dict[str, torch.Tensor] | None = None) -> Path:
    """Write checkpoint ``step`` under ``root`` atomically (see the module docstring), then
    keep only the newest ``keep`` complete checkpoints.

    Args:
        root: checkpoint directory.
        backend: the training backend (``save_checkpoint(path, include_optimizer=...)``).
        trainer_state: JSON-able loop state (step, cursor, metrics so far, …).
        keep: complete checkpoints kept (``--keep-checkpoints``, >= 1).
        include_optimizer: False to leave out the optimizer state (the final checkpoint of
            a completed run; recorded as ``optimizer_state`` in ``trainer_state.json``).
        engine_weights: the engine's weights (Hugging Face names) when they differ from
            the trainer's, else ``None``.

    Returns:
        the checkpoint directory ``root/step_N``.

    Raises:
        CheckpointError: the write failed (``OSError``: disk full, permissions, …); the
            partial ``step_N.tmp`` is removed and the previous complete checkpoint is intact.
    """
    from safetensors.torch import save_file

    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    root = Path(root)
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    old = root / f"step_{step:06d}.old"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        backend.save_checkpoint(str(tmp / "backend"), include_optimizer=include_optimizer)
        js, tensors = rng_state()
        (tmp / "rng.json").write_text(json.dumps(js))
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "rng_torch.safetensors"))
        (tmp / "trainer_state.json").write_text(json.dumps({**trainer_state, "optimizer_state": include_optimizer}))
        if engine_weights is not None:
            save_file({k: v.contiguous() for k, v in engine_weights.items()}, str(tmp / ENGINE_WEIGHTS))
        _seal(tmp)
        if final.exists():  # the same step saved again: swap only now that the new one is complete
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync_dir(root)
        _atomic_write(root / LATEST, final.name)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        prev = [p for p in complete_checkpoints(root) if p != final or is_complete(final)]
        kept = f"the previous checkpoint {prev[-1]} is intact" if prev else "no earlier checkpoint exists"
        raise CheckpointError(e.errno, f"writing checkpoint {final} failed: {e.strerror or e} "
                                       f"({type(e).__name__}); {kept}") from e
    shutil.rmtree(old, ignore_errors=True)
    _rotate(root, step, keep)
    return final


def _rotate(root: Path, step: int, keep: int) -> None:
    """Remove what no resume needs once checkpoint ``step`` is complete: complete
    checkpoints older than the newest ``keep``, incomplete step directories older than
    ``step`` (they are not resumable), and leftover ``.tmp`` / ``.old`` directories."""
    complete = complete_checkpoints(root)
    keepers = {p for p in complete if _step_of(p) <= step}
    keepers = set(sorted(keepers, key=_step_of)[-keep:]) | {p for p in complete if _step_of(p) > step}
    for p in root.iterdir():
        if not p.is_dir() or p in keepers or not re.match(r"step_\d+", p.name):
            continue
        m = _STEP_DIR.match(p.name)
        if p.name.endswith((".tmp", ".old")) or (m and (_step_of(p) < step or p in complete)):
            shutil.rmtree(p, ignore_errors=True)


def resume_checkpoint(root: Path) -> tuple[Path | None, str | None]:
    """The checkpoint ``--resume`` continues from: the newest complete one.

    Returns:
        ``(path, note)``: ``path`` is ``None`` when there is no complete checkpoint;
        ``note`` says why it is not the one ``latest`` names (missing, incomplete), else
        ``None``.
    """
    root = Path(root)
    complete = complete_checkpoints(root)
    path = complete[-1] if complete else None
    marker = root / LATEST
    named = marker.read_text().strip() if marker.is_file() else None
    note = None
    if named and (path is None or path.name != named):
        where = "is missing" if not (root / named).exists() else "is incomplete"
        note = (f"{marker} names {named}, which {where}; "
                + (f"resuming from {path.name}, the newest complete checkpoint" if path else "no complete checkpoint"))
    return path, note


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or ``None``."""
    return resume_checkpoint(root)[0]


def run_disk_usage(run_dir: str | Path) -> int:
    """Bytes on disk under ``run_dir`` (files' apparent sizes; symbolic links are not
    followed).  Returns 0 for a missing directory."""
    total = 0
    for dirpath, _, filenames in os.walk(run_dir):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:  # removed while walking
                pass
    return total


def format_size(n: int) -> str:
    """``1536`` -> ``"1.5 kB"`` (powers of 1000, as ``du -h --si``)."""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def convert_hf_dtype(directory: str | Path, dtype: torch.dtype) -> None:
    """Rewrite every floating-point tensor of the ``*.safetensors`` files under a Hugging
    Face model directory in ``dtype`` (e.g. ``--save-hf-dtype bfloat16`` halves ``final/``)
    and record it in each ``config.json`` (``torch_dtype`` and ``dtype``)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    name = str(dtype).removeprefix("torch.")
    for path in sorted(Path(directory).rglob("*.safetensors")):
        with safe_open(str(path), "pt") as fh:
            meta = fh.metadata()
        tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in load_file(str(path)).items()}
        tmp = path.with_name(path.name + ".tmp")
        save_file(tensors, str(tmp), metadata=meta)
        os.replace(tmp, path)
    for cfg_path in sorted(Path(directory).rglob("config.json")):
        cfg = json.loads(cfg_path.read_text())
        cfg.update({"torch_dtype": name, "dtype": name} if "dtype" in cfg else {"torch_dtype": name})
        cfg_path.write_text(json.dumps(cfg, indent=2))


def load_checkpoint(path: Path, backend: Any) -> dict:
    """Restore the backend and the RNG states from ``path``; return the trainer state."""
    from safetensors.torch import load_file

    path = Path(path)
    backend.load_checkpoint(str(path / "backend"))
    set_rng_state(json.loads((path / "rng.json").read_text()), load_file(str(path / "rng_torch.safetensors")))
    return json.loads((path / "trainer_state.json").read_text())


def load_engine_weights(path: Path) -> dict[str, torch.Tensor] | None:
    """The engine weights a checkpoint holds (see :func:`save_checkpoint`), or ``None``."""
    from safetensors.torch import load_file

    f = Path(path) / ENGINE_WEIGHTS
    return load_file(str(f)) if f.is_file() else None


def save_final_model(directory: Path, backend: Any, tokenizer: Any, dtype: str = "train") -> Path:
    """Write the trained model in Hugging Face format (``--save-hf``) with its tokenizer, in
    ``dtype`` (``--save-hf-dtype``: ``train`` keeps the training dtype, ``bfloat16`` halves a
    float32 model); returns ``directory``."""
    backend.save_hf(str(directory))
    tokenizer.save_pretrained(str(directory))
    if dtype == "bfloat16":
        convert_hf_dtype(directory, torch.bfloat16)
    return Path(directory)
