"""Helpers of the Ray tests: `relax train` flags for short runs on the tiny model, an
in-process runner, and the trained-prompt log reader."""

from __future__ import annotations

import json
from pathlib import Path

import train_helpers
from train_helpers import run_train  # noqa: F401  (the suite's runner)


def ray_args(model: Path, data: Path, out: Path, name: str, *extra: str) -> list[str]:
    """`relax train --launcher ray` flags (:func:`train_helpers.tiny_args`): 4 steps, the Ray
    scorers, ``--lr 1e-2``, no final model."""
    return train_helpers.tiny_args(model, data, out, "--no-save-hf", "--launcher", "ray", *extra,
                                   scorer="relax_ray_scorers:vowel_fraction", lr="1e-2", steps=4, name=name)


def trained(run: Path) -> list[dict]:
    """The run's `trained_prompts.jsonl` records."""
    return [json.loads(x) for x in (run / "trained_prompts.jsonl").read_text().splitlines()]
