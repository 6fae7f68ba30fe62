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


def ray_and_local(model: Path, data: Path, out: Path, *flags: str) -> tuple[list[dict], list[dict], str]:
    """Run the same short run on Ray (:func:`ray_args`, ``--run-name ray``) and locally (the
    same flags, ``--run-name local``) → (the Ray run's metrics, the local run's, the Ray run's
    output); each run must exit 0."""
    from relax_core.reporting.metrics import read_metrics

    code, ray_out = run_train(ray_args(model, data, out, "ray", *flags))
    assert code == 0, ray_out
    code, out_local = run_train(train_helpers.tiny_args(model, data, out, "--no-save-hf", *flags,
                                                        scorer="relax_ray_scorers:vowel_fraction", lr="1e-2",
                                                        name="local"))
    assert code == 0, out_local
    return read_metrics(out / "ray"), read_metrics(out / "local"), ray_out


def trained(run: Path) -> list[dict]:
    """The run's `trained_prompts.jsonl` records."""
    return [json.loads(x) for x in (run / "trained_prompts.jsonl").read_text().splitlines()]
