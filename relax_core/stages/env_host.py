"""Where environment calls run (``--env-isolation``): threads of the rollout process, or
worker processes that can be killed.

The episode runner (:mod:`relax_core.stages.episodes`) makes every call into an environment
(``prompt(text)``, ``start(row)``, ``episode.step(turn)``) through a host, ``--env-num-workers`` calls at once,
each under ``--env-timeout`` seconds; a call that raises (or returns something other than a
:class:`~relax_core.environments.Reply`) gives ``(ENV_ERROR, text)``, one past its timeout
``(ENV_TIMEOUT, text)``, and the runner ends that episode:

- :class:`ThreadHost` (``thread``, the default): daemon threads.  Cheap, no pickling, but a
  call that hangs cannot be stopped, only abandoned (its thread runs on, outside the worker
  count), and a call that crashes the interpreter (a segfault in an extension) ends the run.
- :class:`ProcessHost` (``process``): ``--env-num-workers`` spawned processes, each holding
  its own copy of the environment (built from the spec's factory, the parameters and the
  config) and the episodes started in it (episode ``i`` of a call lives in worker
  ``i mod n``).  A call past its timeout gets its worker killed (SIGKILL); a worker that dies
  (segfault, ``os._exit``, the OOM killer) is noticed; either way the worker is replaced and
  the run goes on.  The other episodes that lived in that worker are lost with it: their next
  call gives ``ENV_ERROR`` ("lost with its worker").  Rows, turns and replies cross the
  process boundary by pickle.

Both keep the episodes of one :meth:`start` until the next (the runner's ``generate``).
This module imports nothing heavy (the workers import it).
"""

from __future__ import annotations

import importlib
import math
import multiprocessing as mp
import pickle
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_connections
from typing import Any, Callable

from relax_core.environments import EPISODE_ENDS, FAULT_ENDS, Reply, prompt_of
from relax_core.run.interrupts import (
    SPAWN_TRIES,
    as_worker,
    killed_while_starting,
    messages,
    spawn_worker,
    stop_workers,
)

ENV_ERROR, ENV_TIMEOUT = (EPISODE_ENDS.index(e) for e in FAULT_ENDS)
#: seconds a spawned worker may take to import the environment's plugin and build it
STARTUP_TIMEOUT = 120.0
#: the longest single wait (seconds); longer timeouts are waited in pieces (``select`` and
#: ``poll`` take milliseconds as a C int, about 2.1e6 s at most)
MAX_WAIT = 3600.0
Result = tuple[int | None, Any]  # (None, value) | (ENV_ERROR, text) | (ENV_TIMEOUT, text)


def checked(reply: Any) -> Reply:
    """``reply`` if it is a :class:`Reply`; raises ``TypeError`` otherwise."""
    if not isinstance(reply, Reply):
        raise TypeError(f"step returned {type(reply).__name__}, not a relax_core.environments.Reply")
    return reply


def _error(e: BaseException) -> Result:
    return ENV_ERROR, f"{type(e).__name__}: {e}"


def call_all(calls: list[Callable[[], Any]], timeout: float, workers: int) -> list[Result]:
    """Run ``calls`` in daemon threads, ``workers`` at a time (in order, in waves), each wave
    waiting at most ``timeout`` seconds.

    Returns:
        per call ``(None, value)``, ``(ENV_ERROR, "<Type>: <message>")`` when it raised, or
        ``(ENV_TIMEOUT, text)`` when it had not returned by its wave's deadline (its thread is
        abandoned; it cannot be stopped).
    """
    out: list[Result] = [(ENV_TIMEOUT, f"a call ran past --env-timeout {timeout:g} s")] * len(calls)

    def run(i: int) -> None:
        try:
            out[i] = (None, calls[i]())
        except Exception as e:  # noqa: BLE001 - the episode's fault, reported per episode
            out[i] = _error(e)

    for lo in range(0, len(calls), workers):
        threads = [threading.Thread(target=run, args=(i,), daemon=True, name="relax-env-step")
                   for i in range(lo, min(lo + workers, len(calls)))]
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout
        for t in threads:
            while t.is_alive() and (left := deadline - time.monotonic()) > 0:
                t.join(min(left, MAX_WAIT))
    return list(out)  # a copy: an abandoned thread that returns later changes nothing


class ThreadHost:
    """Environment calls in daemon threads of this process (see the module docstring).

    Args:
        environment: the environment object (``start(row) -> episode``).
        timeout: ``--env-timeout``, seconds per call.
        workers: ``--env-num-workers``, calls at once.
    """

    restarts = 0  # threads are never replaced

    def __init__(self, environment: Any, timeout: float, workers: int):
        self.environment, self.timeout, self.workers = environment, timeout, workers

    def prompts(self, texts: list[str]) -> list[Result]:
        """The prompt the environment wants for each text (``prompt_of``); a value is a ``str``.
        An environment without ``prompt`` (``single_turn``) has nothing to call: the texts
        come back as they are, without a thread."""
        if getattr(self.environment, "prompt", None) is None:
            return [(None, x) for x in texts]
        return call_all([lambda x=x: prompt_of(self.environment, x) for x in texts], self.timeout, self.workers)

    def start(self, rows: list[dict]) -> list[Result]:
        """``environment.start(row)`` per row; a value is the episode's handle for :meth:`step`."""
        return call_all([lambda r=r: self.environment.start(r) for r in rows], self.timeout, self.workers)

    def step(self, handles: list[Any], turns: list[Any]) -> list[Result]:
        """``episode.step(turn)`` per (handle, turn); a value is the :class:`Reply`."""
        return call_all([lambda h=h, t=t: checked(h.step(t)) for h, t in zip(handles, turns)],
                        self.timeout, self.workers)

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- processes


def _worker_main(conn: Any, factory: str, params: Any, config: Any) -> None:
    """Worker process: build the environment, then serve calls.

    Messages in: ``("start", id, row)``, ``("step", id, turn)``, ``("prompt", id, text)``
    (the environment's prompt for ``text``), ``("clear",)`` (forget every
    episode; no answer) or ``None`` (stop).  Out: ``("ready",)`` or ``("fatal", text)`` once,
    then per call ``(id, fault, value)`` with ``fault`` ``None`` or ``ENV_ERROR``.  SIGINT is
    ignored (a terminal's Ctrl-C reaches the whole process group; the parent decides), and
    the worker exits when its parent does.
    """
    as_worker()
    try:
        module, _, attr = factory.partition(":")
        env = getattr(importlib.import_module(module), attr)(params, config)
    except BaseException:  # noqa: BLE001 - reported to the parent
        conn.send(("fatal", traceback.format_exc(limit=4)))
        return
    conn.send(("ready",))
    episodes: dict[int, Any] = {}
    for msg in messages(conn):
        if msg[0] == "clear":
            episodes.clear()
            continue
        kind, eid, arg = msg
        try:
            if kind == "start":
                episodes[eid] = env.start(arg)
                out: Result = (None, eid)  # the handle
            elif kind == "prompt":
                out = (None, prompt_of(env, arg))
            else:
                out = (None, checked(episodes[eid].step(arg)))
        except Exception as e:  # noqa: BLE001 - the episode's fault
            out = _error(e)
        try:
            conn.send((eid, *out))
        except Exception as e:  # noqa: BLE001 - a reply that does not pickle
            conn.send((eid, *_error(e)))


@dataclass
class _Worker:
    process: Any
    conn: Any
    generation: int
    queue: deque = field(default_factory=deque)  # (id, message) to send, in order
    busy: int | None = None  # the id of the call in flight
    deadline: float = math.inf


class ProcessHost:
    """Environment calls in killable worker processes (see the module docstring).

    Args:
        factory: the environment spec's ``factory`` (``package.module:callable``), called in
            each worker as ``factory(params, config)``.
        params, config: the environment's parameters and the run config (pickled).
        timeout: ``--env-timeout``, seconds per call (from when it is sent to its worker).
        workers: ``--env-num-workers``, worker processes.

    Raises:
        RuntimeError: a worker cannot build the environment, or does not start within
            :data:`STARTUP_TIMEOUT` seconds (scripts that start a run must guard it with
            ``if __name__ == "__main__":``, since workers are spawned).
    """

    def __init__(self, factory: str, params: Any, config: Any, timeout: float, workers: int):
        self._args = (factory, params, config)
        self.timeout = timeout
        self._ctx = mp.get_context("spawn")
        self._generation = 0
        self.restarts = 0
        """Workers replaced (killed past a timeout, or found dead) since the host started."""
        self._owner: dict[int, tuple[int, int]] = {}  # episode id -> (worker index, generation)
        self._workers = [self._spawn() for _ in range(workers)]  # they start side by side
        for k, w in enumerate(self._workers):
            if not self._ready(w):
                self._workers[k] = self._started()

    def _spawn(self) -> _Worker:
        self._generation += 1
        return _Worker(*spawn_worker(self._ctx, _worker_main, self._args, "relax-env-worker"), self._generation)

    def _started(self) -> _Worker:
        """A new worker that has built the environment.  One that a Ctrl-C killed while it
        started is started again (:func:`~relax_core.run.interrupts.killed_while_starting`)."""
        for _ in range(SPAWN_TRIES):
            w = self._spawn()
            if self._ready(w):
                return w
        self.close()
        raise RuntimeError(f"an environment worker was killed by SIGINT while starting, {SPAWN_TRIES} times")

    def _ready(self, w: _Worker) -> bool:
        """Wait for worker ``w`` to build the environment: ``True`` when it has, ``False`` when
        a SIGINT killed it first (exit status −SIGINT); raises otherwise (after closing)."""
        if not w.conn.poll(STARTUP_TIMEOUT):
            self.close()
            raise RuntimeError(f"an environment worker did not start within {STARTUP_TIMEOUT:.0f} s")
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            if killed_while_starting(w.process):
                w.conn.close()
                return False
            msg = ("fatal", "it exited while starting (workers are spawned: a script that starts a run must "
                            "guard it with `if __name__ == '__main__':`)")
        if msg[0] != "ready":
            self.close()
            raise RuntimeError(f"an environment worker could not build the environment:\n{msg[1]}")
        return True

    def _replace(self, k: int) -> None:
        """Kill worker ``k`` (if alive) and start another in its place; its episodes are lost."""
        old = self._workers[k]
        old.process.kill()
        old.process.join(timeout=5)
        old.conn.close()
        new = self._started()
        new.queue = old.queue
        self._workers[k] = new
        self.restarts += 1

    def prompts(self, texts: list[str]) -> list[Result]:
        """The prompt the environment wants for each text (its ``prompt``), computed in the
        workers (text ``i`` in worker ``i mod workers``); a value is a ``str``.  Episodes in
        progress are kept."""
        return self._run([(i, ("prompt", i, x)) for i, x in enumerate(texts)])

    def start(self, rows: list[dict]) -> list[Result]:
        """Forget the previous episodes and start one per row (episode ``i`` in worker
        ``i mod workers``); a value is the episode's handle (its id) for :meth:`step`."""
        for w in self._workers:
            try:
                w.conn.send(("clear",))
            except OSError:  # died while idle: noticed on its next call
                pass
        self._owner = {}
        return self._run([(i, ("start", i, row)) for i, row in enumerate(rows)])

    def step(self, handles: list[int], turns: list[Any]) -> list[Result]:
        """``step(turn)`` of each episode (by handle); a value is the :class:`Reply`."""
        return self._run([(h, ("step", h, t)) for h, t in zip(handles, turns)])

    def _run(self, calls: list[tuple[int, tuple]]) -> list[Result]:
        n = len(self._workers)
        results: dict[int, Result] = {}
        resent: set[int] = set()  # calls sent again after their worker was found dead while idle
        for eid, msg in calls:
            self._workers[eid % n].queue.append((eid, msg))
        while True:
            for k in range(n):
                w = self._workers[k]
                while w.busy is None and w.queue:
                    eid, msg = w.queue.popleft()
                    if msg[0] == "step" and self._owner.get(eid) != (k, w.generation):
                        results[eid] = (ENV_ERROR, "the episode was lost with its environment worker, which was "
                                                   "replaced (a call past its timeout or a crash, or found dead)")
                        continue
                    try:
                        data = pickle.dumps(msg)
                    except Exception as e:  # noqa: BLE001 - a row or turn that does not pickle
                        results[eid] = _error(e)
                        continue
                    try:
                        w.conn.send_bytes(data)
                    except OSError:  # the worker died while idle: replace it, send the call once more
                        if eid in resent:
                            results[eid] = (ENV_ERROR, "its environment worker died before taking the call, twice")
                            continue
                        resent.add(eid)
                        w.queue.appendleft((eid, msg))
                        self._replace(k)
                        w = self._workers[k]
                        continue
                    if msg[0] == "start":
                        self._owner[eid] = (k, w.generation)
                    w.busy, w.deadline = eid, time.monotonic() + self.timeout
            busy = [w for w in self._workers if w.busy is not None]
            if not busy:
                return [results[eid] for eid, _ in calls]
            wait_s = min(MAX_WAIT, max(0.0, min(w.deadline for w in busy) - time.monotonic()))
            for conn in wait_connections([w.conn for w in busy], timeout=wait_s):
                self._receive(next(k for k, w in enumerate(self._workers) if w.conn is conn), results)
            now = time.monotonic()
            for k, w in enumerate(self._workers):
                if w.busy is not None and w.deadline <= now:
                    if w.conn.poll(0):  # it answered in time; read next round (a replacement may have delayed us)
                        continue
                    results[w.busy] = (ENV_TIMEOUT, f"a call ran past --env-timeout {self.timeout:g} s; its "
                                                    "worker was killed")
                    self._replace(k)

    def _receive(self, k: int, results: dict[int, Result]) -> None:
        """Read worker ``k``'s answer to its call in flight into ``results``."""
        w = self._workers[k]
        try:
            eid, fault, value = w.conn.recv()
        except (EOFError, OSError):  # died in the call: segfault, os._exit, the OOM killer
            w.process.join(timeout=5)
            results[w.busy] = (ENV_ERROR, f"its environment worker died (exit code {w.process.exitcode})")
            self._replace(k)
            return
        except Exception as e:  # noqa: BLE001 - a reply that does not unpickle here
            eid, fault, value = w.busy, *_error(e)
        results[eid] = (fault, value)
        w.busy, w.deadline = None, math.inf

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        stop_workers(self._workers)
        self._workers = []
