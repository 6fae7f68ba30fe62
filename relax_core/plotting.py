"""``relax plot``: metrics against step as a PNG, several runs overlaid.

Reads each run's ``metrics.jsonl`` (:func:`relax_core.metrics.read_metrics`) and draws one
panel per metric (default: reward, response length, loss, KL), one line per run, labelled
with the run directory's name.  Uses matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import math
from pathlib import Path

from relax_core.metrics import read_metrics

DEFAULT_METRICS = ("rollout/raw_reward", "rollout/response_len/mean", "train/loss", "train/kl_loss")
#: Fallbacks when a default metric was not logged (e.g. no KL loss in the run).
FALLBACK = {"train/kl_loss": "train/ppo_kl"}


def _series(records: list[dict], metric: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in records:
        v = r.get(metric)
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(int(r["step"]))
            ys.append(float(v))
    return xs, ys


def plot_runs(run_dirs: list[str | Path], metrics: list[str] | None = None, out: str | Path | None = None) -> Path:
    """Write the PNG and return its path (default ``<first run>/metrics.png``).

    Raises:
        FileNotFoundError: a run directory without ``metrics.jsonl``.
        ValueError: no run directory, or none of the metrics was logged by any run.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not run_dirs:
        raise ValueError("give at least one run directory")
    runs = [(Path(d).resolve().name, read_metrics(d)) for d in run_dirs]
    wanted = list(metrics or DEFAULT_METRICS)
    chosen = []
    for m in wanted:
        if any(_series(recs, m)[0] for _, recs in runs):
            chosen.append(m)
        elif metrics is None and m in FALLBACK and any(_series(recs, FALLBACK[m])[0] for _, recs in runs):
            chosen.append(FALLBACK[m])
    if not chosen:
        logged = sorted({k for _, recs in runs for r in recs for k in r if k != "step"})
        raise ValueError(f"none of {', '.join(wanted)} was logged; logged metrics: {', '.join(logged)}")
    cols = 2 if len(chosen) > 1 else 1
    rows = math.ceil(len(chosen) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.6 * rows), squeeze=False)
    for ax, m in zip(axes.flat, chosen):
        for name, recs in runs:
            xs, ys = _series(recs, m)
            if xs:
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=name)
        ax.set_title(m)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(chosen):]:
        ax.set_visible(False)
    fig.tight_layout()
    path = Path(out) if out else Path(run_dirs[0]) / "metrics.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
