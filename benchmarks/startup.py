"""Startup latency of the `relax` CLI and of plugin loading + validation.

Medians over N runs, measured side by side in one run:

- ``relax --help`` and ``relax capabilities`` as subprocesses (interpreter start included),
- plugin loading (all installed ``relax.plugins`` entry points) + building and validating a
  full configuration, in-process, after the imports are warm.

Targets (issue 2): ``relax --help`` < 0.3 s (must be < 0.5 s); load + validate < 0.2 s.

    .venv/bin/python benchmarks/startup.py [--runs N] [--out benchmarks/results/startup.txt]
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
    from relax_core.plugins import load_registry
    from relax_core.validation import resolve

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--out", default=None, help="also write the table to this file")
    a = ap.parse_args()
    env_note = f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    help_s = _median_subprocess([str(RELAX), "--help"], a.runs)
    caps_s = _median_subprocess([str(RELAX), "capabilities"], a.runs)
    import_s = _median_subprocess([sys.executable, "-c", "import cli.main"], a.runs)
    bare_s = _median_subprocess([sys.executable, "-c", "pass"], a.runs)
    load_s, problems = _median_in_process(a.runs)
    rows = [
        ("relax --help (subprocess)", help_s, "< 0.3 s (must be < 0.5 s)", help_s < 0.5),
        ("relax capabilities (subprocess)", caps_s, "", True),
        ("python -c 'import cli.main'", import_s, "", True),
        ("python -c 'pass' (interpreter floor)", bare_s, "", True),
        ("load plugins + validate full config (in-process)", load_s, "< 0.2 s", load_s < 0.2),
    ]
    lines = [f"relax startup, median of {a.runs} runs ({env_note})", "",
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
