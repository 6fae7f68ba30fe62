"""Checkpoints: everything needed to continue a run exactly where it stopped.

Layout (``--save``, default ``<run dir>/checkpoints``)::

    step_000012/
        backend/             model + optimizer + scheduler (the backend's own format)
        trainer_state.json   step, data cursor, consecutive skipped steps, metrics so far,
                             the weight version the engine holds
        engine.safetensors   the engine's weights, only when they lag the trainer's
                             (--update-weights-interval > 1, saved between two pushes)
        rng.json             python and numpy RNG states
        rng_torch.safetensors  torch CPU (and CUDA) RNG states
    latest                   name of the newest complete checkpoint

A checkpoint is written into ``step_N.tmp`` and renamed to ``step_N`` only when complete,
then ``latest`` is replaced atomically, so a process killed while saving leaves the
previous checkpoint intact.  Only safetensors and JSON are read back (no pickles).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

LATEST = "latest"
ENGINE_WEIGHTS = "engine.safetensors"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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
                    engine_weights: dict[str, torch.Tensor] | None = None) -> Path:
    """Write checkpoint ``step`` under ``root`` atomically; keep the newest ``keep``.

    Args:
        root: checkpoint directory.
        backend: the training backend (``save_checkpoint(path)``).
        trainer_state: JSON-able loop state (step, cursor, metrics so far, …).
        engine_weights: the engine's weights (Hugging Face names) when they differ from
            the trainer's, else ``None``.
    """
    from safetensors.torch import save_file

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    backend.save_checkpoint(str(tmp / "backend"))
    js, tensors = rng_state()
    (tmp / "rng.json").write_text(json.dumps(js))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "rng_torch.safetensors"))
    (tmp / "trainer_state.json").write_text(json.dumps(trainer_state))
    if engine_weights is not None:
        save_file({k: v.contiguous() for k, v in engine_weights.items()}, str(tmp / ENGINE_WEIGHTS))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _atomic_write(root / LATEST, final.name)
    for old in sorted(p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or ``None``."""
    marker = Path(root) / LATEST
    if not marker.is_file():
        return None
    path = Path(root) / marker.read_text().strip()
    return path if (path / "trainer_state.json").is_file() else None


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
