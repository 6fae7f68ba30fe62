"""The end-of-run summary: what the run did and where everything is.

Read from the run directory alone (``metrics.jsonl`` and the files next to it), so it is the
same for a fresh, a resumed or an interrupted run::

    relax: done: 20 of 20 steps in 4:18
      reward              0.188 → 0.438   (first-quarter mean 0.520 → last 0.440)
      held-out chain_sum  pass@1 21% → best 54% → last 42% (steps 0, 10, 20)
      metrics             runs/grpo-…/metrics.jsonl
      samples             runs/grpo-…/samples.jsonl
      checkpoint          runs/grpo-…/checkpoints/step_000020
      final model         runs/grpo-…/final
      plot                relax plot runs/grpo-…
      size on disk        2.1 GB

Its fixed lines fit an 80-column terminal (file paths are as long as they are).
"""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

from relax_core.reporting.metrics import read_metrics
from relax_core.reporting.progress import clock
from relax_core.run.checkpoint import format_size, latest_checkpoint, run_disk_usage

REWARD = "rollout/raw_reward"


def _values(records: list[dict], key: str) -> list[tuple[int, float]]:
    return [(int(r["step"]), float(r[key])) for r in records
            if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def relax_command() -> str:
    """How to call ``relax`` from here: ``relax`` when it is on PATH, else the path of the
    installed script (e.g. ``.venv/bin/relax``) so that the printed commands copy-paste."""
    if shutil.which("relax"):
        return "relax"
    script = Path(sys.executable).parent / "relax"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def summary_lines(run_dir: Path, *, total: int, wall_s: float, ckpt_dir: Path | None = None) -> list[str]:
    """The summary of the run in ``run_dir`` (see the module docstring).

    Args:
        total: the configured ``--num-rollout``.
        wall_s: the wall time of this process (model load included).
        ckpt_dir: the checkpoint directory (default ``<run_dir>/checkpoints``).
    """
    run_dir = Path(run_dir)
    ckpt_dir = Path(ckpt_dir) if ckpt_dir else run_dir / "checkpoints"
    records = read_metrics(run_dir) if (run_dir / "metrics.jsonl").is_file() else []
    steps = [r for r in records if int(r["step"]) > 0]
    done = "done" if steps and int(steps[-1]["step"]) >= total else "stopped"
    lines = [f"relax: {done}: {len(steps)} of {total} steps in {clock(wall_s)}"]
    rows: list[tuple[str, str]] = []
    reward = [v for _, v in _values(steps, REWARD)]
    if reward:
        q = max(1, len(reward) // 4)
        rows.append(("reward", f"{reward[0]:.3f} → {reward[-1]:.3f}   (first-quarter mean {_mean(reward[:q]):.3f}"
                               f" → last {_mean(reward[-q:]):.3f})"))
    eval_keys = sorted({k for r in records for k in r if k.startswith("eval/") and k.endswith("/pass@1")})
    for key in eval_keys:
        vals = _values(records, key)
        best = max(vals, key=lambda sv: sv[1])
        name = key[len("eval/"):-len("/pass@1")]
        rows.append((f"held-out {name}", f"pass@1 {vals[0][1]:.0%} → best {best[1]:.0%} → last {vals[-1][1]:.0%} "
                                         f"(steps {vals[0][0]}, {best[0]}, {vals[-1][0]})"))
    for label, path in (("metrics", run_dir / "metrics.jsonl"), ("samples", run_dir / "samples.jsonl")):
        if path.is_file():
            rows.append((label, str(path)))
    latest = latest_checkpoint(ckpt_dir)
    if latest is not None:
        rows.append(("checkpoint", str(latest)))
    if (run_dir / "final").is_dir():
        rows.append(("final model", str(run_dir / "final")))
    if records:
        rows.append(("plot", f"{relax_command()} plot {run_dir}"))
    size = run_disk_usage(run_dir) + (run_disk_usage(ckpt_dir) if run_dir not in ckpt_dir.parents else 0)
    rows.append(("size on disk", format_size(size)))
    width = max(len(k) for k, _ in rows)
    return lines + [f"  {k:<{width}}  {v}" for k, v in rows]
