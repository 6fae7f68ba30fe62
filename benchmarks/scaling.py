"""Scaling of one Relax training step: step time as the batch grows (1×, 2×, 4× prompts), and
data parallel 1 vs 2 ranks on Ray.

Batch growth: three long-lived ``relax train`` workers (the gated workers of
:mod:`e2e_trl`, the real trainer code path), one per batch size, on the same tiny random
Qwen3 (``relax_authoring.testing.models.make_tiny_model``) with the same prompts, group size and maximum
response length; the driver alternates their steps round-robin (a warm-up step each, then the
counted steps), so all three see the same machine load.  Reported: median seconds per step,
trained tokens/s, and the step time relative to 1× (ideal data-bound scaling would be 2.0 and
4.0 at constant tokens/s; below that, fixed per-step costs are being amortised).

Data parallel on Ray: ``relax train --launcher ray`` with ``--actor-num-gpus-per-node 1`` and
``2`` (training ranks as Ray actors, one CPU and one torch thread each, gradients all-reduced
over gloo; one rollout engine actor) on the 2× batch.  Each configuration starts its own local
Ray cluster, so the two run one after the other (not alternated); Ray's start-up is in the
load time, not in the step times.

Run:  .venv/bin/python benchmarks/scaling.py [--steps 2] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import e2e_trl  # noqa: E402


def _env(a: argparse.Namespace) -> dict:
    return {**os.environ, "PYTHONPATH": str(HERE), "OMP_NUM_THREADS": str(a.threads), "TOKENIZERS_PARALLELISM": "false",
            "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "RAY_AUTH_MODE": "disabled"}


def _cmd(a: argparse.Namespace, work: Path, name: str, prompts: int, flags: str = "") -> list[str]:
    return [sys.executable, str(HERE / "e2e_trl.py"), "--worker", "relax", "--out-dir", str(work / name),
            "--model-dir", a.model, "--data", a.data, "--prompts", str(prompts), "--group", str(a.group),
            "--max-new", str(a.max_new), "--total-steps", str(a.warmup + a.steps), "--threads", str(a.threads),
            "--relax-flags", flags]


def run_alternated(a: argparse.Namespace, work: Path, configs: dict[str, tuple[int, str]]) -> dict[str, list[dict]]:
    """Start one gated worker per config (name -> (prompts, extra flags)), then alternate
    their steps round-robin; returns each one's step reports (warm-up included)."""
    workers, results, load = {}, {}, {}
    total = a.warmup + a.steps
    try:
        for name, (prompts, flags) in configs.items():
            w = workers[name] = e2e_trl.Side(name, _cmd(a, work, name, prompts, flags), _env(a), work / f"{name}.log")
            assert w.read()["event"] == "ready"
            load[name] = time.perf_counter() - w.t_start
            results[name] = []
        names = list(configs)
        for step in range(total):
            for name in (names if step % 2 == 0 else names[::-1]):
                w = workers[name]
                w.send("go")
                r = w.read()
                assert r["event"] == "step", r
                results[name].append(r)
                if step < total - 1:
                    assert w.read()["event"] == "ready"
    finally:
        for w in workers.values():
            w.close()
    return {name: {"rows": rows, "load_s": load[name]} for name, rows in results.items()}


def summarise(rows: list[dict], warmup: int) -> dict:
    counted = rows[warmup:]
    return {"s_per_step": statistics.median(r["seconds"] for r in counted),
            "trained_tok_s": sum(r["trained_tokens"] for r in counted) / sum(r["seconds"] for r in counted),
            "gen_share": sum(r["gen_seconds"] for r in counted) / sum(r["seconds"] for r in counted)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2, help="counted steps per batch size")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=2, help="prompts per step at 1×")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="1 prompt × 2 samples × 8 tokens at 1× and 2×, 1 step, no Ray")
    ap.add_argument("--no-ray", action="store_true", help="skip the data-parallel part")
    a = ap.parse_args()
    a.multiples = [1, 2, 4]
    if a.smoke:
        a.steps, a.prompts, a.group, a.max_new, a.multiples, a.no_ray = 1, 1, 2, 8, [1, 2], True
    print(f"scaling: python {platform.python_version()}, {os.cpu_count()} cores, {a.threads} torch threads, "
          f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="relax-scaling-") as tmp:
        work = Path(tmp)
        a.model = e2e_trl.model_dir("tiny", work)
        a.data = str(work / "prompts.jsonl")
        e2e_trl.write_prompts(Path(a.data))
        t0 = time.perf_counter()
        growth = run_alternated(a, work, {f"x{m}": (a.prompts * m, "") for m in a.multiples})
        wall = time.perf_counter() - t0
        dp = {}
        if not a.no_ray:
            for ranks in (1, 2):
                dp.update(run_alternated(a, work, {f"dp{ranks}": (a.prompts * 2, f"--launcher ray --actor-num-gpus-per-node {ranks}")}))
    base = summarise(growth["x1"]["rows"], a.warmup)
    print(f"\nbatch growth (tiny Qwen3, {a.group} samples per prompt, max {a.max_new} new tokens; "
          f"{a.warmup} warm-up + {a.steps} counted steps each, alternated; {wall:.0f} s in all)")
    print(f"{'batch':>6}{'samples':>9}{'s/step':>9}{'vs 1x':>8}{'trained tok/s':>15}{'gen share':>11}")
    for m in a.multiples:
        r = summarise(growth[f"x{m}"]["rows"], a.warmup)
        print(f"{m:>5}x{a.prompts * m * a.group:>9}{r['s_per_step']:>9.2f}{r['s_per_step'] / base['s_per_step']:>7.2f}x"
              f"{r['trained_tok_s']:>15.0f}{r['gen_share']:>10.0%}")
    if not dp:
        print("\ndata parallel on Ray: skipped (--no-ray)")
        return
    print(f"\ndata parallel on Ray (2x batch: {a.prompts * 2 * a.group} samples; --launcher ray, one engine actor, "
          f"1 CPU per rank; run one after the other)")
    print(f"{'ranks':>6}{'s/step':>9}{'trained tok/s':>15}{'gen share':>11}{'start-up s':>12}")
    for ranks in (1, 2):
        r = summarise(dp[f"dp{ranks}"]["rows"], a.warmup)
        print(f"{ranks:>6}{r['s_per_step']:>9.2f}{r['trained_tok_s']:>15.0f}{r['gen_share']:>10.0%}"
              f"{dp[f'dp{ranks}']['load_s']:>12.1f}")


if __name__ == "__main__":
    main()
