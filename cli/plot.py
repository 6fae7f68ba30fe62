"""``relax plot``: metrics against step as a PNG, several runs overlaid.

Reads each run's ``metrics.jsonl`` (:func:`relax_core.reporting.metrics.read_metrics`) and draws one
panel per metric, one colour per run, labelled with the run directory's name.  The default
panels are the ones that carry information for the runs at hand:

1. the reward: each step's value (faint) and a smoothed line (a centred moving average);
2. the held-out evaluation (``eval/<data>/pass@1``), when logged;
3. the response length;
4. of grad norm, entropy, clipfrac, PPO KL and KL loss, those that vary over the run (the
   loss is left out: with one update per rollout it is float noise around 0, and so are
   ``ppo_kl`` and clipfrac, which are then exactly 0).

Steps are integers on the x axis.  One run's plot goes to ``<run>/metrics.png``; an overlay
of several runs to a new file named after them, next to the first run
(``runs/plot-grpo-a_vs_rloo-b.png``), so that no run's own plot is overwritten.  Uses
matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path

from relax_core.reporting.metrics import read_metrics

REWARD = "rollout/raw_reward"
LENGTH = "rollout/response_len/mean"
#: Shown when they vary over the run, in this order.
OPTIONAL = ("train/grad_norm", "train/entropy", "train/pg_clipfrac", "train/ppo_kl", "train/kl_loss")
#: A metric "varies" when its range exceeds this (absolute) amount.
VARIES = 1e-6
MAX_NAME = 120


class PlotError(ValueError):
    """Bad input for ``relax plot`` (not a run directory, a metric no run logged)."""


def _series(records: list[dict], metric: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in records:
        v = r.get(metric)
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(int(r["step"]))
            ys.append(float(v))
    return xs, ys


def smooth(ys: list[float], window: int | None = None) -> list[float]:
    """Centred moving average (the window shrinks at the ends); default window: about a
    tenth of the run, at least 3 steps."""
    n = len(ys)
    w = window or max(3, n // 10)
    half = w // 2
    return [sum(ys[max(0, i - half):i + half + 1]) / len(ys[max(0, i - half):i + half + 1]) for i in range(n)]


def default_metrics(runs: list[tuple[str, list[dict]]]) -> list[str]:
    """The default panels for these runs (see the module docstring)."""
    logged = {k for _, recs in runs for r in recs for k in r}
    held_out = sorted(k for k in logged if k.startswith("eval/") and k.endswith("/pass@1"))
    chosen = [m for m in (REWARD, *held_out, LENGTH) if m in logged]
    for m in OPTIONAL:
        values = [y for _, recs in runs for y in _series(recs, m)[1]]
        if values and max(values) - min(values) > VARIES:
            chosen.append(m)
    return chosen


def output_path(run_dirs: list[Path], names: list[str]) -> Path:
    """``<run>/metrics.png`` for one run; for several, a file named after the runs next to
    the first (``plot-<a>_vs_<b>.png``, shortened when long)."""
    if len(run_dirs) == 1:
        return run_dirs[0] / "metrics.png"
    stem = "_vs_".join(names)
    if len(stem) > MAX_NAME:
        stem = f"{names[0]}_vs_{names[1]}_and_{len(names) - 2}_more"
    return run_dirs[0].parent / f"plot-{stem}.png"


def load_runs(run_dirs: list[str | Path]) -> list[tuple[str, list[dict]]]:
    """``(run name, records)`` per directory.

    Raises:
        PlotError: no directory given, or one without a readable ``metrics.jsonl``.
    """
    if not run_dirs:
        raise PlotError("give at least one run directory")
    runs = []
    for d in run_dirs:
        try:
            runs.append((Path(d).resolve().name, read_metrics(d)))
        except FileNotFoundError as e:
            raise PlotError(str(e)) from None
        except (ValueError, KeyError) as e:  # a corrupt line
            raise PlotError(f"{Path(d) / 'metrics.jsonl'}: unreadable ({type(e).__name__}: {e})") from None
    return runs


def plot_runs(run_dirs: list[str | Path], metrics: list[str] | None = None, out: str | Path | None = None) -> Path:
    """Write the PNG and return its path (see :func:`output_path`).

    Raises:
        PlotError: a bad run directory, or a requested metric that no run logged (with the
            closest logged names).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    runs = load_runs(run_dirs)
    logged = sorted({k for _, recs in runs for r in recs for k in r if k != "step"})
    if metrics:
        unknown = [m for m in metrics if m not in logged]
        if unknown:
            hints = [f"{m} (did you mean {', '.join(close)}?)" if (close := difflib.get_close_matches(m, logged, n=2))
                     else m for m in unknown]
            raise PlotError(f"not logged by {'this run' if len(runs) == 1 else 'any of these runs'}: "
                            f"{'; '.join(hints)} (`relax plot --help`; the metrics are the keys of metrics.jsonl)")
        chosen = list(metrics)
    else:
        chosen = default_metrics(runs)
        if not chosen:
            raise PlotError(f"nothing to plot: no reward or length logged; logged metrics: {', '.join(logged) or 'none'}")
    cols = 2 if len(chosen) > 1 else 1
    rows = math.ceil(len(chosen) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.4 * rows), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, m in zip(axes.flat, chosen):
        for i, (name, recs) in enumerate(runs):
            xs, ys = _series(recs, m)
            if not xs:
                continue
            c = colours[i % len(colours)]
            if m == REWARD and len(xs) > 2:
                ax.plot(xs, ys, "o", color=c, alpha=0.35, markersize=3)
                ax.plot(xs, smooth(ys), color=c, label=f"{name} (smoothed)")
            else:
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, color=c, label=name)
        ax.set_title(m)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(chosen):]:
        ax.set_visible(False)
    fig.tight_layout()
    path = Path(out) if out else output_path([Path(d) for d in run_dirs], [n for n, _ in runs])
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
