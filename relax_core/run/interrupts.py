"""Ctrl-C.  A terminal sends SIGINT to the whole foreground process group: the trainer
(first Ctrl-C: finish the step, save a checkpoint, exit 130; second: :class:`RunAborted`)
and every worker process (the scorers' and the environments' pools), which ignore it and
are stopped by their parent: :func:`spawn_worker`, :func:`as_worker`, :func:`stop_workers`."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
from typing import Any, Callable, Iterator

#: starts of one worker when a SIGINT kills it while it starts (:func:`killed_while_starting`)
SPAWN_TRIES = 3


class RunAborted(KeyboardInterrupt):
    """A second Ctrl-C: stop at once.  Checkpoint writes are atomic, so the last complete
    checkpoint is left as it was; :func:`relax_core.run.launch.launch` reports it in one line."""


def spawn_worker(ctx: Any, target: Callable[..., None], args: tuple, name: str) -> tuple[Any, Any]:
    """Start ``target(child_conn, *args)`` in a spawned daemon process ``name``.

    The child starts with SIGINT ignored (Python keeps an inherited ignore across spawn's
    exec), so a Ctrl-C while it imports cannot kill it; for the parent the change lasts only
    the fork+exec (milliseconds) and is made only on the main thread, where signal handlers
    live (a worker spawned elsewhere relies on :func:`as_worker`).

    Returns:
        ``(process, parent_conn)``.
    """
    parent, child = ctx.Pipe()
    p = ctx.Process(target=target, args=(child, *args), daemon=True, name=name)
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        p.start()
    finally:
        if main:
            restore_sigint(previous)
    child.close()
    return p, parent


def restore_sigint(previous: Any) -> None:
    """Put back the SIGINT handler ``previous`` that ``signal.signal`` returned.  ``None``
    (a handler installed outside Python, which Python cannot reinstall) becomes Python's
    own, :func:`signal.default_int_handler`: leaving the temporary handler in place would
    make every later Ctrl-C of the process do nothing.  Main thread only."""
    signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)


def killed_while_starting(process: Any) -> bool:
    """Whether a worker ``process`` whose pipe closed before it was ready was killed by SIGINT
    (exit status −SIGINT; waits up to 5 s for it to end).  Its parent starts such a worker
    again, up to :data:`SPAWN_TRIES` times: a worker spawned off the main thread (a fully-async
    rollout replacing one) cannot have SIGINT ignored before its interpreter is up, so a
    Ctrl-C in that window kills it."""
    process.join(timeout=5)
    return process.exitcode == -signal.SIGINT


def as_worker() -> None:
    """In a worker process: ignore SIGINT (the parent finishes its step, then stops the
    workers) and exit when the parent does (a worker stuck in a call must not outlive a
    killed trainer)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = mp.parent_process()
    if parent is not None:
        threading.Thread(target=lambda: (parent.join(), os._exit(0)), daemon=True).start()


def stop_workers(workers: list[Any]) -> None:
    """Ask each worker (``.process``, ``.conn``) to stop (``None``), wait 2 s, then kill."""
    for w in workers:
        try:
            w.conn.send(None)
        except (OSError, ValueError):
            pass
    for w in workers:
        w.process.join(timeout=2)
        if w.process.is_alive():
            w.process.kill()
            w.process.join(timeout=5)
        w.conn.close()


def messages(conn: Any) -> Iterator[Any]:
    """In a worker process: the messages from the parent, until ``None`` (stop) or the
    parent's end of the pipe closes."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        yield msg
