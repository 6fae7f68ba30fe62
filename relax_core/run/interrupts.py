"""Ctrl-C.  A terminal sends SIGINT to the whole foreground process group: the trainer
(first Ctrl-C: finish the step, save a checkpoint, exit 130; second: :class:`RunAborted`)
and every worker process, which ignore it and are stopped by their parent
(:mod:`relax_core.stages.rewarding`)."""

from __future__ import annotations


class RunAborted(KeyboardInterrupt):
    """A second Ctrl-C: stop at once.  Checkpoint writes are atomic, so the last complete
    checkpoint is left as it was; :func:`relax_core.run.launch.launch` reports it in one line."""
