"""Where a run's peak RSS is reached: the peak of each stage of ``relax train`` (Linux only).

Runs ``relax train`` with the given arguments in this process and, around each stage
(generation, scoring, evaluation, advantages, the training forward, its backward, AdamW, the
weight push, checkpoints), resets the kernel's peak-RSS counter (``VmHWM``, by writing ``5``
to ``/proc/self/clear_refs``; see proc(5)) and records, when the stage ends, its peak and the
RSS it leaves.  What happens between two stages is recorded as ``between`` (start-up before
the first).  One JSON line per stage call goes to ``--log`` (default ``memory_stages.jsonl``)::

    .venv/bin/python benchmarks/memory_stages.py [--log FILE] [--trim] -- [relax train arguments]

``--trim`` calls glibc's ``malloc_trim(0)`` after each stage (freed heap pages go back to the
system), to tell memory in use from memory the allocator keeps.  The peak RSS that
``/usr/bin/time`` or ``perf/peak_rss_gib`` report for such a run is the last stage's only,
since the counter is reset: read the JSON lines.  The torch backend only (its forward and
AdamW are wrapped).  Results: ``benchmarks/results/memory-20261206.md``.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import sys
import time
from typing import Any


class StageLog:
    """Peak and resident set of each stage call, in GiB, one JSON line each."""

    def __init__(self, path: str, trim: bool):
        self.out = open(path, "a")
        self.trim = ctypes.CDLL("libc.so.6").malloc_trim if trim else None
        self.reset()

    @staticmethod
    def status() -> dict[str, float]:
        """``VmRSS`` and ``VmHWM`` of this process, GiB."""
        out = {}
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0]) / 2**20
        return out

    @staticmethod
    def reset() -> None:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    def record(self, stage: str, seconds: float | None = None) -> None:
        s = self.status()
        self.out.write(json.dumps({"stage": stage, "peak_gib": round(s["VmHWM"], 3), "rss_gib": round(s["VmRSS"], 3),
                                   "s": None if seconds is None else round(seconds, 2)}) + "\n")
        self.out.flush()

    def wrap(self, owner: Any, name: str, stage: str) -> None:
        """Record ``owner.name`` as ``stage`` (and what ran before it as ``between``)."""
        orig = getattr(owner, name)

        @functools.wraps(orig)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.record("between")
            self.reset()
            t0 = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                self.record(stage, time.perf_counter() - t0)
                if self.trim is not None:
                    self.trim(0)
                self.reset()

        setattr(owner, name, wrapped)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log", default="memory_stages.jsonl")
    ap.add_argument("--trim", action="store_true", help="malloc_trim(0) after each stage")
    ap.add_argument("train_args", nargs=argparse.REMAINDER, help="relax train's arguments, after --")
    args = ap.parse_args()
    import torch

    from cli.main import app
    from relax_core import trainer
    from relax_core.stages import rollout
    from relax_torch.backend import TorchBackend

    log = StageLog(args.log, args.trim)
    for owner, name, stage in [(rollout.Rollout, "generate", "generate"), (rollout.Rollout, "score", "score"),
                               (rollout.Rollout, "evaluate", "evaluate"), (trainer.Trainer, "advantages", "advantages"),
                               (TorchBackend, "_forward_mb", "forward"), (torch.Tensor, "backward", "backward"),
                               (TorchBackend, "apply_gradients", "adamw"), (rollout.Publisher, "after_step", "publish"),
                               (trainer.Trainer, "save", "save")]:
        log.wrap(owner, name, stage)
    rest = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    sys.argv = ["relax", "train", *rest]
    app()


if __name__ == "__main__":  # the reward workers are spawned: they re-import this file
    main()
