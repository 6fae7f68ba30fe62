"""Run the whole benchmark suite and write one results file (``make bench``).

Each benchmark is a script of its own that measures both sides in one invocation,
alternates them and prints medians and ratios; this driver runs them one after the other
(never two at once), and writes their output, with the machine, versions, load average, date
and command, to ``benchmarks/results/bench-<UTC date>-<time>.md`` (``--out`` to choose).

    .venv/bin/python benchmarks/run_all.py [--smoke] [--only NAME,...] [--out FILE] [--budget MIN]

About 9 minutes on the 2-core development machine when nobody else uses it (each part's
duration, quiet and under load, is in ``BENCHMARKS.md``); the results file ends with a table
of the minutes each part took and the load average before and after it.  ``--budget`` (default 20
minutes) is a safeguard: a part still running when the budget is spent is stopped, and the
parts after it are reported as not run.  ``--smoke`` runs every script at tiny sizes, to check
that they still work.  The end-to-end comparison needs TRL's own venv
(``make benchmarks/.envs/trl/bin/python``); the engine comparison needs ``.venv-vllm``
(see ``.ci/vllm.sh``) and the vLLM engineer's ``benchmarks/engines.py``: a part whose
environment is missing is reported as not measured, not silently dropped.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
TRL_PY = HERE / ".envs" / "trl" / "bin" / "python"

#: (name, interpreter, script, full-run arguments, smoke arguments, what it measures), in the order
#: they run: the issue's headline parts first, so that a spent --budget stops the least important.
SUITE = [
    ("algorithm", PY, "algorithm.py", [], ["--smoke"],
     "1. algorithm stage: relax vs loop vs bandwidth floor, 64k/1M/8M tokens; M2PO solver scaling"),
    ("e2e_trl", PY, "e2e_trl.py", [], ["--smoke"],
     "2. end to end vs TRL GRPOTrainer (tiny Qwen3, SmolLM2-135M)"),
    ("startup", PY, "startup.py", ["--runs", "9"], ["--smoke"],
     "4. start-up: relax --help, capabilities, load + validation, first rollout token"),
    ("engines", VLLM_PY, "engines.py", ["--prompts", "2", "--samples", "4", "--new-tokens", "32", "--repeats", "3"],
     ["--prompts", "1", "--samples", "2", "--new-tokens", "4", "--repeats", "1"],
     "3. rollout engines: hf vs vllm on the same batch (the vLLM engineer's benchmark, in .venv-vllm)"),
    ("step_speed", PY, "step_speed.py", ["--model", "default", "--repeats", "3"], ["--smoke"],
     "issue 24: training time per step, each exact lever off vs on (--shared-prefix), SmolLM2-135M"),
    ("lora", PY, "lora.py", ["--model", "default", "--repeats", "3"], ["--smoke"],
     "issue 21: LoRA vs full fine-tuning, SmolLM2-135M: step time, peak RSS, checkpoint size, bytes per parameter"),
    ("reward_scoring", PY, "reward_scoring.py", [], ["--n", "16"],
     "reward scoring: worker pool vs serial (the rewards engineer's benchmark)"),
    ("scaling", PY, "scaling.py", ["--steps", "4"], ["--smoke"],
     "5. scaling: batch 1x/2x/4x, data parallel 1 vs 2 ranks on Ray"),
    ("async", PY, "async.py", ["--steps", "3", "--repeats", "1", "--out", os.devnull],
     ["--steps", "2", "--repeats", "1", "--out", os.devnull],
     "5b. sync vs fully-async on Ray, Ray start-up (the Ray engineer's benchmark)"),
    ("ray_round_trips", PY, "ray_round_trips.py", [], ["--smoke"],
     "5c. the Ray optimizer step's four control round trips (grad norm, step count, apply, zero) vs a local step"),
    ("judge_agreement", PY, "judge_agreement.py", ["--n", "64"], ["--smoke"],
     "issue 22: SmolLM2-135M as a temperature-0 llm_judge vs the rule scorer, 64 responses (the 200-response "
     "figure: benchmarks/results/judge_agreement-20261202.txt)"),
    ("learning_race", PY, "learning_race.py",
     ["--seeds", "0", "--steps", "4", "--eval-prompts", "16", "--out", os.devnull], ["--smoke"],
     "issue 23: the learning race vs TRL, short (1 seed, 4 steps, 16 held-out prompts; the full race: "
     "learning_race.py alone)"),
]


def has_smoke_mode(script: Path) -> bool:
    """Whether a script offers ``--smoke`` (scripts by other engineers may not yet)."""
    return '"--smoke"' in script.read_text()


def _run(cmd: list[str], timeout: float | None = None) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def machine() -> list[str]:
    cpu = "?"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = "?"
    try:
        kb = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")))
        mem = f"{kb / 2**20:.0f} GiB"
    except (OSError, StopIteration):
        pass
    versions = _run([PY, "-c", "import torch, transformers, ray; print(f'torch {torch.__version__}, transformers "
                               "{transformers.__version__}, ray {ray.__version__}')"])
    trl = _run([str(TRL_PY), "-c", "import trl, transformers; print(f'trl {trl.__version__} (transformers "
                                   "{transformers.__version__})')"]) if TRL_PY.exists() else "absent"
    vllm = _run([str(VLLM_PY), "-c", "import vllm; print(f'vllm {vllm.__version__}')"], 120) if VLLM_PY.exists() else "absent"
    return [
        f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: {platform.machine()}, {cpu}, {os.cpu_count()} logical CPUs, {mem} RAM, {platform.platform()}",
        f"- python {platform.python_version()}; {versions}",
        f"- TRL venv: {trl}; vLLM venv: {vllm}",
        f"- git commit: {_run(['git', '-C', str(ROOT), 'rev-parse', '--short', 'HEAD'])}"
        f"{' (uncommitted changes)' if _run(['git', '-C', str(ROOT), 'status', '--porcelain', '--untracked-files=no', '--', 'benchmarks']) else ''}",
        f"- command: {' '.join([Path(PY).name, *sys.argv])}",
        f"- load average at start: {', '.join(f'{x:.1f}' for x in os.getloadavg())} "
        "(a shared machine: absolute figures move with the load; ratios are measured side by side)",
    ]


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def run_part(cmd: list[str], env: dict, deadline: float) -> tuple[int, list[str], list[str], bool]:
    """Run one part, echoing its stdout as it comes; stop its whole process group at
    ``deadline`` (``time.perf_counter()`` value).  Returns (exit code, stdout lines,
    stderr tail, stopped by the budget)."""
    out_lines: list[str] = []
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=str(ROOT),
                             start_new_session=True)
        stopped = threading.Event()

        def stop() -> None:
            stopped.set()
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

        timer = threading.Timer(max(0.0, deadline - time.perf_counter()), stop)
        timer.start()
        try:
            for line in p.stdout:  # shown as it comes, kept for the results file
                print(line, end="", flush=True)
                out_lines.append(line.rstrip("\n"))
            code = p.wait()
        finally:
            timer.cancel()
        err.seek(0)
        return code, out_lines, err.read().splitlines()[-25:], stopped.is_set()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="every script at tiny sizes (checks they run)")
    ap.add_argument("--only", default="", help="comma list of parts: " + ", ".join(s[0] for s in SUITE))
    ap.add_argument("--out", default=None, help="results file (default benchmarks/results/bench-<date>.md; "
                                                "with --smoke, nothing is written unless given)")
    ap.add_argument("--budget", type=float, default=20.0,
                    help="minutes for the whole suite: a part running past it is stopped, later parts are not run")
    a = ap.parse_args()
    only = {x.strip() for x in a.only.split(",") if x.strip()}
    unknown = only - {s[0] for s in SUITE}
    if unknown:
        ap.error(f"unknown part(s): {', '.join(sorted(unknown))}")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M")
    out = Path(a.out) if a.out else (None if a.smoke else HERE / "results" / f"bench-{stamp}.md")
    lines = ["# Relax benchmark results" + (" (smoke run: tiny sizes, not figures)" if a.smoke else ""), ""]
    lines += machine()
    print("\n".join(lines), flush=True)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    failed = []
    timing = []  # (part, seconds or None, status, load before, load after)
    t_all = time.perf_counter()
    deadline = t_all + 60 * a.budget
    for name, interp, script, full, smoke, what in SUITE:
        if only and name not in only:
            continue
        path = HERE / script
        head = f"\n## {what}\n"
        if not path.exists() or not Path(interp).exists():
            missing = path if not path.exists() else interp
            body = f"NOT MEASURED: {missing} is missing on this machine."
            print(head + body, flush=True)
            lines += [head, body]
            timing.append((name, None, "not measured (missing)", _load(), ""))
            continue
        if a.smoke and "--smoke" in smoke and not has_smoke_mode(path):
            print(head + "skipped: no --smoke mode", flush=True)
            lines += [head, "skipped: no --smoke mode"]
            timing.append((name, None, "skipped (no --smoke)", _load(), ""))
            continue
        if time.perf_counter() >= deadline:
            body = f"NOT RUN: the --budget of {a.budget:g} min was spent."
            print(head + body, flush=True)
            lines += [head, body]
            failed.append(name)
            timing.append((name, None, "not run (budget)", _load(), ""))
            continue
        cmd = [str(interp), str(path), *(smoke if a.smoke else full)]
        shown = " ".join(Path(c).name if i < 2 else c for i, c in enumerate(cmd))
        print(head + f"$ {shown}", flush=True)
        load0, t0 = _load(), time.perf_counter()
        code, out_lines, err_tail, stopped = run_part(cmd, env, deadline)
        dt = time.perf_counter() - t0
        text = "\n".join(out_lines).rstrip()
        status = "ok"
        if code != 0:
            failed.append(name)
            status = "STOPPED (budget)" if stopped else f"FAILED (exit {code})"
            fail = f"{status}; stderr tail:\n" + "\n".join(err_tail)
            print(fail, flush=True)
            text += "\n\n" + fail
        print(f"({dt:.0f} s)", flush=True)
        timing.append((name, dt, status, load0, _load()))
        lines += [head, f"`{shown}` ({dt:.0f} s; load average {load0} before, {_load()} after)", "",
                  "```", text, "```"]
    total = time.perf_counter() - t_all
    table = ["", "## How long each part took", "",
             "| part | minutes | status | load average before | after |", "|---|---|---|---|---|"]
    table += [f"| {n} | {'' if dt is None else f'{dt / 60:.1f}'} | {st} | {l0} | {l1} |" for n, dt, st, l0, l1 in timing]
    table += ["", f"suite: {total / 60:.1f} min (budget {a.budget:g} min), ended "
                  f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; load average at the end: {_load()}"
              + (f"; FAILED: {', '.join(failed)}" if failed else "")]
    print("\n".join(table))
    lines += table
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(lines) + "\n")
        print(f"results written to {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
