"""Metric sinks and the run directory.

A run directory holds::

    config.json        the resolved configuration (plugin parameters included)
    run_info.json      relax-core and plugin versions, git commit, old-log-prob mode, data sizes
    metrics.jsonl      one JSON object per step: {"step": N, "rollout/raw_reward": …, …}
    samples.jsonl      a few rollouts per step: step, prompt, response, reward, label
    checkpoints/       see :mod:`relax_core.run.checkpoint`
    final/             the final model in Hugging Face format

:class:`MetricsLogger` writes ``metrics.jsonl``, mirrors to Weights & Biases when
``--wandb-project`` is set (``--wandb-mode offline`` needs no network; the API key comes
only from the environment, never from the config), and reports each step to the run's
display (:mod:`relax_core.reporting.progress`: a live line in a terminal, plain lines otherwise).
"""

from __future__ import annotations

import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _clean(v: Any) -> Any:
    """JSON-safe value: non-finite floats become strings ("nan", "inf")."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def peak_rss_gib() -> float:
    """The process's peak resident set size so far, in GiB (2**30 bytes).

    On Linux ``VmHWM`` of ``/proc/self/status`` (proc(5)): the high-water mark of this
    process image.  ``getrusage``'s ``ru_maxrss`` is the fallback elsewhere (KiB, bytes on
    macOS; see getrusage(2)); on Linux it is not used because it survives ``execve``, so a
    trainer started by a large process (a test runner, a notebook) would report its parent's
    size.  The trainer's process only: reward and environment workers are processes of their own.
    """
    try:
        with open("/proc/self/status") as fh:
            kib = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 if sys.platform == "darwin" else 1)
    return kib / 2**20


def git_commit(path: Path) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


class MetricsLogger:
    """Writes each step's metrics to ``metrics.jsonl``, W&B and the terminal.

    Args:
        run_dir: the run directory.
        cfg: the run config (``quiet``, ``wandb_project``, ``wandb_mode``, ``num_rollout``).
        config_dict: the resolved config, sent to W&B as its config.
        start_step: first step of this process (resume: steps before it are kept).
    """

    def __init__(self, run_dir: Path, cfg: Any, config_dict: dict, start_step: int = 0) -> None:
        self.run_dir = Path(run_dir)
        self.cfg = cfg
        self.total = cfg.num_rollout
        self.start_step = start_step
        self.t0 = time.monotonic()
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.samples_path = self.run_dir / "samples.jsonl"
        self._wandb = None
        if cfg.wandb_project and cfg.wandb_mode != "disabled":
            import wandb

            self._wandb = wandb.init(project=cfg.wandb_project, name=self.run_dir.name, mode=cfg.wandb_mode,
                                     dir=str(self.run_dir), config=config_dict, resume="allow",
                                     id=self.run_dir.name.replace("/", "_"))
        from relax_core.reporting import progress

        self._own_display = progress.current() is None  # outside `relax train` (tests, scripts)
        self.display = progress.start(cfg) if self._own_display else progress.current()
        self.display.begin(self.total, start_step)
        evaluating = cfg.eval_source and start_step == 0
        self.display.phase("held-out evaluation before step 1" if evaluating else
                           f"step {start_step + 1}: generating, scoring and training")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record the metrics of ``step`` (1-based)."""
        record = {"step": step, **{k: _clean(v) for k, v in sorted(metrics.items())}}
        with self.metrics_path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)
        if step > 0:
            self.display.step(step, metrics)
        else:  # the held-out evaluation before the first step
            from relax_core.reporting.progress import metric_parts

            self.display.message("held-out evaluation before step 1: " + " | ".join(metric_parts(metrics)))
            self.display.phase("step 1: generating, scoring and training")
            self.display.begin(self.total, self.start_step)  # the ETA counts from the first step

    def log_samples(self, step: int, samples: list[dict]) -> None:
        with self.samples_path.open("a") as fh:
            for s in samples:
                fh.write(json.dumps({"step": step, **{k: _clean(v) for k, v in s.items()}}, default=str) + "\n")

    def message(self, text: str) -> None:
        """A line for the user (above the live display, or plain on stderr)."""
        self.display.message(text)

    def close(self) -> None:
        if self._own_display:
            from relax_core.reporting import progress

            progress.close()
            self._own_display = False
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of ``<run_dir>/metrics.jsonl`` (last record per step wins)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (is {run_dir} a relax run directory?)")
    by_step: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            by_step[int(rec["step"])] = rec
    return [by_step[s] for s in sorted(by_step)]


def rewrite_metrics(run_dir: Path, records: list[dict]) -> None:
    """Replace ``metrics.jsonl`` by ``records`` (resume: drop steps after the checkpoint)."""
    path = Path(run_dir) / "metrics.jsonl"
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(path)


def non_finite(metrics: dict[str, float]) -> str:
    """``"name=value, ..."`` of the metrics that are not finite (``"(none reported)"``)."""
    bad = {k: v for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)}
    return ", ".join(f"{k}={v}" for k, v in sorted(bad.items())) or "(none reported)"
