"""Synchronous vs fully-async training on Ray, and Ray's start-up overhead, on this machine.

The same run (a random tiny Qwen3 from :func:`relax_authoring.testing.models.make_tiny_model`, GRPO,
``--rollout-batch-size 4 × --n-samples-per-prompt 8``, 32 new tokens, ``--num-rollout N``)
is launched as ``relax train`` subprocesses, one after the other:

- **local**: ``--launcher local`` (everything in one process; torch's default threads),
  and **local-1thr** the same with ``OMP_NUM_THREADS=1`` (as each Ray actor of 1 CPU runs);
- **ray sync**: ``--launcher ray``: one engine actor, one training rank (1 CPU each), rollout
  then training then weights to the engine;
- **ray async**: the same plus ``--fully-async --max-staleness 1``: the rollout of step k+1
  overlaps the training of step k.

Per run: the median step time over steps 2..N (``perf/step_time``: wall time of a step
seen by the trainer, waiting for its batch included), generated tokens per second of wall
time over steps 2..N, the whole process's wall time, and ``ray_startup_s`` (from
``ray.init`` to every actor built, in ``run_info.json``).  Ray's start-up overhead is also
measured alone: ``ray.init`` + ``ray.shutdown`` of an empty local cluster.

The local runs once, then ``--repeats`` alternated ray-sync / ray-async pairs (medians
reported), on a 2-core machine that other jobs share (its load average is printed): the
ratios are indicative (a few tens of percent), not precise.  With 2 cores, the async overlap can at
best hide the shorter of rollout and training behind the longer.

Run:  .venv/bin/python benchmarks/async.py [--steps 8] [--out benchmarks/results/async.txt]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCORER = "vowel_scorer"


def write_inputs(tmp: Path) -> tuple[Path, Path]:
    from relax_authoring.testing.models import make_tiny_model

    model = make_tiny_model(tmp / "tiny", seed=0)
    data = tmp / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + {i + 1}?", "label": str(2 * i + 1)}) + "\n"
                            for i in range(64)))
    (tmp / f"{SCORER}.py").write_text(
        "def score(response, label, metadata):\n"
        "    letters = [c for c in response.lower() if c.isalpha()]\n"
        "    return sum(c in 'aeiou' for c in letters) / len(letters) if letters else 0.0\n")
    return model, data


def run(tmp: Path, model: Path, data: Path, name: str, steps: int, *extra: str, env: dict | None = None) -> dict:
    out = tmp / "runs"
    args = [str(ROOT / ".venv" / "bin" / "relax"), "train", "--model", str(model), "--data", str(data),
            "--output-dir", str(out), "--run-name", name, "--custom-rm-path", f"{SCORER}:score",
            "--rollout-batch-size", "4", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "32",
            "--num-rollout", str(steps), "--quiet", "--lr", "1e-3", "--seed", "1", "--reward-num-workers", "1",
            "--no-save-hf", *extra]
    env = {**os.environ, "PYTHONPATH": f"{tmp}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "RAY_AUTH_MODE": "disabled",
           **(env or {})}
    t0 = time.monotonic()
    proc = subprocess.run(args, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    recs = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
    info = json.loads((out / name / "run_info.json").read_text())
    steady = recs[1:]
    tokens = sum(r["rollout/num_samples"] * r["rollout/response_len/mean"] for r in steady)
    span = sum(r["perf/step_time"] for r in steady)
    return {"name": name, "wall_s": wall, "step_s": statistics.median(r["perf/step_time"] for r in steady),
            "tokens_per_s": tokens / span, "ray_startup_s": info.get("ray_startup_s"),
            "staleness_max": max(r.get("staleness/max", 0.0) for r in recs),
            "trainer_idle_s": statistics.median(r.get("perf/trainer_idle_time", 0.0) for r in steady),
            "rollout_s": statistics.median(r["perf/rollout_time"] for r in steady),
            "train_s": statistics.median(r["perf/train_time"] for r in steady)}


def ray_init_overhead(repeats: int = 2) -> float:
    code = ("import os, time; os.environ['RAY_AUTH_MODE'] = 'disabled'; import ray; t = time.monotonic(); "
            "ray.init(num_cpus=2, include_dashboard=False, _node_ip_address='127.0.0.1', log_to_driver=False); "
            "ray.shutdown(); print(time.monotonic() - t)")
    times = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
                   .stdout.strip().splitlines()[-1]) for _ in range(repeats)]
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2, help="alternated sync/async pairs (the median is reported)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "async.txt"))
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        model, data = write_inputs(tmp)
        rows = [run(tmp, model, data, "local", a.steps),
                run(tmp, model, data, "local-1thr", a.steps, env={"OMP_NUM_THREADS": "1"})]
        for i in range(a.repeats):
            rows.append(run(tmp, model, data, f"ray-sync-{i}", a.steps, "--launcher", "ray"))
            rows.append(run(tmp, model, data, f"ray-async-{i}", a.steps, "--launcher", "ray", "--fully-async",
                            "--max-staleness", "1"))
    init_s = ray_init_overhead()
    by = {"local": rows[0], "local-1thr": rows[1]}
    for name in ("ray-sync", "ray-async"):
        reps = [r for r in rows if r["name"].startswith(name)]
        by[name] = {k: statistics.median(r[k] for r in reps) for k in ("step_s", "tokens_per_s", "wall_s", "ray_startup_s")}
    lines = [f"# benchmarks/async.py  ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
             f"tiny Qwen3, grpo, 4 prompts x 8 samples, 32 new tokens, {a.steps} steps; steady state = steps 2..{a.steps})",
             f"# machine load average (1 min) {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end (shared machine)",
             "",
             f"{'run':<12} {'step s':>8} {'tok/s':>8} {'rollout s':>10} {'train s':>8} {'idle s':>7} "
             f"{'stale max':>9} {'wall s':>7} {'ray start s':>11}"]
    for r in rows:
        lines.append(f"{r['name']:<12} {r['step_s']:>8.2f} {r['tokens_per_s']:>8.1f} {r['rollout_s']:>10.2f} "
                     f"{r['train_s']:>8.2f} {r['trainer_idle_s']:>7.2f} {r['staleness_max']:>9.0f} {r['wall_s']:>7.1f} "
                     f"{(r['ray_startup_s'] or 0.0):>11.1f}")
    sync, asy, local = by["ray-sync"], by["ray-async"], by["local"]
    lines += ["",
              f"medians over {a.repeats} alternated sync/async pairs:",
              f"fully-async / sync (ray): step time x{asy['step_s'] / sync['step_s']:.2f}, "
              f"tokens/s x{asy['tokens_per_s'] / sync['tokens_per_s']:.2f}",
              f"ray sync / local: step time x{sync['step_s'] / local['step_s']:.2f} "
              f"(/ local-1thr: x{sync['step_s'] / by['local-1thr']['step_s']:.2f})",
              f"Ray start-up: ray.init + shutdown of an empty local cluster {init_s:.1f} s; "
              f"ray.init to all actors built {sync['ray_startup_s']:.1f} s (sync run); "
              f"whole-process wall time ray sync - local = {sync['wall_s'] - local['wall_s']:+.1f} s"]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
