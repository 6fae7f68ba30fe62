"""`relax train` helpers shared by the end-to-end, Ray and fault suites: the tiny prompt
file, the flags of a short run on the tiny model, and an in-process runner.  Each suite's
conftest puts ``tests/`` on ``sys.path`` and fixes its own scorer and learning rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

#: the built-in estimators, each with a recipe in examples/recipes/<name>.yaml
ESTIMATORS = ("grpo", "rloo", "ppo", "cispo", "gspo", "sapo", "m2po", "reinforce_plus_plus",
              "reinforce_plus_plus_baseline")


@pytest.fixture(scope="session")
def prompts_file(tmp_path_factory) -> Path:
    """8 rows ``{"prompt": "What is i + (i+1)?", "label": "2i+1"}`` in a JSONL file."""
    p = tmp_path_factory.mktemp("data") / "prompts.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"What is {i} + {i + 1}?", "label": str(2 * i + 1)}) + "\n"
                         for i in range(8)))
    return p


def tiny_args(model: Path, data: Path, out: Path, *extra: str, scorer: str, lr: str, steps: int = 2,
              name: str = "run") -> list[str]:
    """`relax train` flags for a ``steps``-step run of ``--run-name name`` on a tiny model:
    2 prompts × 4 samples, 8 new tokens, seed 3, one reward worker (a scorer counting its
    calls counts every sample, in order), ``--custom-rm-path scorer``, ``--lr lr``, float32
    on every CPU (``--no-bf16``: bf16 is the default where the CPU has AMX-BF16, and the
    tests compare log-probs to 1e-5); then ``extra`` (which may repeat a flag: the last
    value counts)."""
    return ["--model", str(model), "--data", str(data), "--output-dir", str(out), "--run-name", name,
            "--custom-rm-path", scorer, "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
            "--global-batch-size", "8", "--rollout-max-response-len", "8", "--num-rollout", str(steps), "--quiet",
            "--lr", lr, "--seed", "3", "--reward-num-workers", "1", "--no-bf16", *extra]


def run_train(args: list[str]) -> tuple[int, str]:
    """Run `relax train ARGS` in this process; returns (exit code, output).

    Raises:
        the run's exception, if it raised anything but ``SystemExit``.
    """
    from typer.testing import CliRunner

    from cli.main import app

    res = CliRunner().invoke(app, ["train", *args])
    if res.exception and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res.exit_code, res.output
