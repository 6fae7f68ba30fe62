"""Shared fixtures of the Ray tests: one local Ray (2 CPUs, 127.0.0.1, token auth off) per
session, a tiny prompt file, and `relax train` flags for short runs on the tiny model."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from relax_core.testing.fixtures import tiny_model_dir  # noqa: F401  (session fixture)

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray with 2 logical CPUs; `relax train --launcher ray` reuses it."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray = pytest.importorskip("ray")
    if ray.is_initialized():  # started by another test of this session: keep it
        yield ray
        return
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def prompts_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("data") / "prompts.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"What is {i} + {i + 1}?", "label": str(2 * i + 1)}) + "\n"
                         for i in range(8)))
    return p


def ray_args(model: Path, data: Path, out: Path, name: str, *extra: str) -> list[str]:
    """`relax train --launcher ray` flags: 2 prompts × 4 samples, 8 new tokens, 4 steps."""
    return ["--model", str(model), "--data", str(data), "--output-dir", str(out), "--run-name", name,
            "--custom-rm-path", "relax_ray_scorers:vowel_fraction", "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "4", "--global-batch-size", "8", "--rollout-max-response-len", "8",
            "--num-rollout", "4", "--quiet", "--lr", "1e-2", "--seed", "3", "--reward-num-workers", "1",
            "--no-save-hf", "--launcher", "ray", *extra]


def run_train(args: list[str]) -> tuple[int, str]:
    """Run `relax train ARGS` in this process; returns (exit code, output)."""
    from typer.testing import CliRunner

    from cli.main import app

    res = CliRunner().invoke(app, ["train", *args])
    if res.exception and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res.exit_code, res.output


def trained(run: Path) -> list[dict]:
    """The run's `trained_prompts.jsonl` records."""
    return [json.loads(x) for x in (run / "trained_prompts.jsonl").read_text().splitlines()]
