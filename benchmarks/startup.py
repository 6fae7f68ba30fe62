"""Startup latency of the `relax` CLI and of plugin loading + validation.

Medians over N runs, measured side by side in one run:

- ``relax --help`` and ``relax capabilities`` as subprocesses (interpreter start included),
- plugin loading (all installed ``relax.plugins`` entry points) + building and validating a
  full configuration, in-process, after the imports are warm;
- time to the first rollout token: a fresh process that loads the plugins, validates the
  configuration, builds the ``hf`` rollout engine (model and tokenizer) and generates one
  token, timed from process launch to that token (a tiny random Qwen3 from
  ``relax_authoring.testing.models.make_tiny_model``, and the embedded SmolLM2-135M-Instruct).

Targets (issue 2): ``relax --help`` < 0.3 s (must be < 0.5 s); load + validate < 0.2 s.

    .venv/bin/python benchmarks/startup.py [--runs N] [--out benchmarks/results/startup.txt] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RELAX = Path(sys.executable).with_name("relax")

FULL_CONFIG = ["--estimator", "grpo", "--n-samples-per-prompt", "8", "--rollout-batch-size", "4",
               "--kl-loss-coef", "0.001", "--use-kl-loss", "--eps-clip-high", "0.28", "--correction", "tis",
               "--reward-processor", "overlong_penalty", "--calculate-per-token-loss"]


def _median_subprocess(args: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _load_and_validate() -> int:
    from relax_core.config import build_config, parse_cli
    from relax_core.host.plugins import load_registry
    from relax_core.host.validation import resolve

    reg = load_registry()
    schemas = reg.param_schemas()
    cli, _, _ = parse_cli(FULL_CONFIG, schemas)
    cfg = build_config(cli=cli, param_schemas=schemas)
    _, problems = resolve(cfg, reg)
    return len(problems)


def _median_in_process(runs: int) -> tuple[float, int]:
    problems = _load_and_validate()  # warm the imports: this measures the work, not the first import
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        _load_and_validate()
        times.append(time.perf_counter() - t)
    return statistics.median(times), problems


def _first_token(model: str) -> None:
    """(In a fresh process) load plugins, validate, build the hf engine, generate 1 token."""
    from relax_core.config import build_config, parse_cli
    from relax_core.contracts import SamplingParams
    from relax_core.host.plugins import load_registry
    from relax_core.host.validation import resolve

    reg = load_registry()
    schemas = reg.param_schemas()
    cli, _, _ = parse_cli(["--model", model, "--device", "cpu"], schemas)
    cfg = build_config(cli=cli, param_schemas=schemas)
    resolved, problems = resolve(cfg, reg)
    assert not problems, problems
    engine = resolved.specs["engine"].build(cfg.params_for(cfg.rollout_engine), cfg)
    ids = engine.tokenizer("What is 2 + 3?")["input_ids"]
    out = engine.generate([ids], SamplingParams(max_new_tokens=1, seed=0))
    assert int(out.response_lengths[0]) == 1


def _median_first_token(model: str, runs: int) -> float:
    return _median_subprocess([sys.executable, __file__, "--first-token", model], runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--out", default=None, help="also write the table to this file")
    ap.add_argument("--smoke", action="store_true", help="one run of each, tiny model only")
    ap.add_argument("--first-token", metavar="MODEL", help=argparse.SUPPRESS)  # internal: the child process
    a = ap.parse_args()
    if a.first_token:
        _first_token(a.first_token)
        return
    if a.smoke:
        a.runs = 1
    env_note = f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    help_s = _median_subprocess([str(RELAX), "--help"], a.runs)
    caps_s = _median_subprocess([str(RELAX), "capabilities"], a.runs)
    import_s = _median_subprocess([sys.executable, "-c", "import cli.main"], a.runs)
    bare_s = _median_subprocess([sys.executable, "-c", "pass"], a.runs)
    load_s, problems = _median_in_process(a.runs)
    import tempfile

    from relax_authoring.testing.models import make_tiny_model
    from relax_core.models import ensure_default_model

    with tempfile.TemporaryDirectory() as tmp:
        tiny = str(make_tiny_model(Path(tmp) / "tiny", seed=0))
        ft_runs = max(1, min(a.runs, 3))
        libs = _median_subprocess([sys.executable, "-c", "import torch; from transformers import AutoModelForCausalLM"],
                                  ft_runs)
        first = [("python -c 'import torch; transformers AutoModel...'", libs),
                 ("time to first rollout token, tiny Qwen3 (subprocess)", _median_first_token(tiny, ft_runs))]
        if not a.smoke:
            first.append(("time to first rollout token, SmolLM2-135M (subprocess)",
                          _median_first_token(str(ensure_default_model()), ft_runs)))
    rows = [
        ("relax --help (subprocess)", help_s, "< 0.3 s (must be < 0.5 s)", help_s < 0.5),
        ("relax capabilities (subprocess)", caps_s, "", True),
        ("python -c 'import cli.main'", import_s, "", True),
        ("python -c 'pass' (interpreter floor)", bare_s, "", True),
        ("load plugins + validate full config (in-process)", load_s, "< 0.2 s", load_s < 0.2),
    ] + [(name, sec, "", True) for name, sec in first]
    lines = [f"relax startup, median of {a.runs} runs ({ft_runs} for the first token; {env_note})", "",
             f"{'measurement':<50} {'median':>9}  target",
             f"{'-' * 50} {'-' * 9}  {'-' * 26}"]
    lines += [f"{name:<50} {sec:>8.3f}s  {target}{'' if ok else '  MISSED'}" for name, sec, target, ok in rows]
    lines += ["", f"full config: relax train {' '.join(FULL_CONFIG)}",
              f"(validation found {problems} problem(s) with the installed plugins; the time includes them)"]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
