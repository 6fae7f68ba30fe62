"""The driver loops of ``--launcher ray``: synchronous (:class:`RayTrainer`) and fully
asynchronous with bounded staleness (:class:`AsyncTrainer`).

Both are the core :class:`~relax_core.trainer.Trainer` (same stages, same maths) plus:

- the weight version of each sample is the one the engines actually held (reported by the
  :class:`~relax_core.distributed.proxies.RayEngine`; ``staleness/mean`` and
  ``staleness/max`` are recorded by every loop, :func:`relax_core.trainer.staleness_metrics`);
- ``trained_prompts.jsonl`` in the run directory: per step, the dataset index, group and
  weight version of every sample trained (exactly-once accounting);
- a training rank that dies stops the run with exit code :data:`EXIT_WORKER_DIED` and a
  message naming the checkpoint to resume from.

Fully async (``--fully-async``).  A rollout thread produces the batches of steps
``k+1, k+2, …`` (generation, scoring, post-processing: :meth:`Trainer.rollout`) while the
trainer trains step ``k``, into a bounded buffer.  The trainer posts its weights after every
``u = --update-weights-interval`` steps and the rollout thread pushes the newest posted
weights to the engines before each generation request (never during one).  Staleness bound
``s = --max-staleness``: the rollout for step ``j`` starts only once weights of version
``j - 1 - s`` or newer have been posted, so every sample's staleness is at most ``s`` for
any ``u`` (validation requires ``s >= u - 1``: with fewer, the weights the bound waits for
are never posted), and ``s = 0`` reproduces the synchronous run.
Metrics: ``perf/trainer_idle_time`` (the trainer waiting for a batch),
``perf/rollout_idle_time`` (the rollout thread waiting at the staleness bound),
``perf/update_weights_time`` (pushing weights to the engines before this step's rollout).
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from dataclasses import replace
from typing import Any

import torch

from relax_core import checkpoint as ckpt
from relax_core.contracts import RolloutBatch
from relax_core.distributed.proxies import TrainingWorkerDied
from relax_core.trainer import Trainer

#: exit code of a run stopped because a training worker died
EXIT_WORKER_DIED = 4
TRAINED_LOG = "trained_prompts.jsonl"


class RayTrainer(Trainer):
    """The synchronous loop over Ray proxies (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_batch: RolloutBatch | None = None

    def generate(self, rows: list[dict], indices: list[int], n: int, sampling: Any, group_offset: int,
                 version: int) -> RolloutBatch:
        # the engines' own version, not the loop's assumption (differs with --update-weights-interval > 1)
        return super().generate(rows, indices, n, sampling, group_offset, self.c.engine.version)

    def rollout(self, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        batch, metrics = self.produce(step)
        metrics["rollout/engine_restarts"] = float(getattr(self.c.engine, "restarts", 0))
        self._last_batch = batch
        return batch, metrics

    def produce(self, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        """The batch of ``step`` (here: generated now)."""
        return super().rollout(step)

    def step(self, step: int) -> dict[str, float]:
        metrics = super().step(step)
        b = self._last_batch
        with (self.run_dir / TRAINED_LOG).open("a") as fh:
            fh.write(json.dumps({"step": step, "prompt_index": b.prompt_index.tolist(),
                                 "group_index": b.group_index.tolist(),
                                 "weight_version": b.weight_version.tolist()}) + "\n")
        return metrics

    def restore(self) -> bool:
        resumed = super().restore()
        path = self.run_dir / TRAINED_LOG
        if path.is_file():  # steps after the checkpoint are trained again
            keep = [x for x in path.read_text().splitlines() if json.loads(x)["step"] <= self.state.step]
            path.write_text("".join(x + "\n" for x in keep))
        return resumed

    def run(self) -> int:
        try:
            return super().run()
        except TrainingWorkerDied as e:
            last = ckpt.latest_checkpoint(self.ckpt_dir)
            where = (f"the last checkpoint is {last} (step {json.loads((last / 'trainer_state.json').read_text())['step']}); "
                     "continue with the same flags and --resume" if last else
                     "no checkpoint was saved (use --save-interval N to keep resumable state)")
            print(f"relax: error: {e}; {where}", file=sys.stderr, flush=True)
            return EXIT_WORKER_DIED


class WeightsMailbox:
    """The trainer's view of the engines in fully-async mode.  ``update_weights`` posts the
    weights (non-blocking); the rollout thread pushes them (:meth:`push_posted`) between
    generation requests.  ``lock`` serialises engine use (rollout thread, evaluation)."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.lock = threading.Lock()
        self._posted: tuple[Any, int] | None = None
        self._posted_lock = threading.Lock()

    @property
    def version(self) -> int:
        return self.engine.version

    @property
    def posted_version(self) -> int:
        """The newest weight version posted by the trainer (the engines' own before any post)."""
        with self._posted_lock:
            posted = self._posted
        return self.engine.version if posted is None else posted[1]

    @property
    def restarts(self) -> int:
        return getattr(self.engine, "restarts", 0)

    def generate(self, prompt_ids: list[list[int]], sampling: Any) -> Any:
        return self.engine.generate(prompt_ids, sampling)

    def update_weights(self, state_dict: Any, version: int) -> None:
        with self._posted_lock:
            self._posted = (state_dict, int(version))

    def push_posted(self) -> float:
        """Push the newest posted weights if the engines hold older ones (call with
        :attr:`lock` held); returns the seconds spent."""
        with self._posted_lock:
            posted = self._posted
        if posted is None or posted[1] <= self.engine.version:
            return 0.0
        t0 = time.monotonic()
        self.engine.update_weights(*posted)
        return time.monotonic() - t0

    def shutdown(self) -> None:
        self.engine.shutdown()


class AsyncTrainer(RayTrainer):
    """``--fully-async``: see the module docstring."""

    def __init__(self, cfg: Any, comps: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(cfg, replace(comps, engine=WeightsMailbox(comps.engine)), *args, **kwargs)
        self._buffer: queue.Queue = queue.Queue(maxsize=cfg.max_staleness + 1)
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._trained_cursor: dict | None = None  # data cursor as of the last step trained
        self._push_time = 0.0

    # ------------------------------------------------------------------ rollout thread

    def _produce_loop(self, first: int) -> None:
        cfg = self.cfg
        try:
            for j in range(first, cfg.num_rollout + 1):
                t0 = time.monotonic()
                with self._cond:
                    while self.c.engine.posted_version < j - 1 - cfg.max_staleness and not self._stop.is_set():
                        self._cond.wait(timeout=1.0)
                if self._stop.is_set():
                    return
                idle = time.monotonic() - t0
                with self.c.engine.lock:
                    push = self.c.engine.push_posted()
                    batch, metrics = Trainer.rollout(self, j)
                    cursor = self.cursor.state()
                metrics["perf/rollout_idle_time"] = idle
                metrics["perf/update_weights_time"] = push
                self._put((j, batch, metrics, cursor))
        except BaseException as e:  # noqa: BLE001 - handed to the trainer thread
            self._put(e)

    def _put(self, item: Any) -> None:
        while not self._stop.is_set():
            try:
                self._buffer.put(item, timeout=1.0)
                return
            except queue.Full:
                continue

    def _stop_thread(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=600)
            self._thread = None

    # ------------------------------------------------------------------ trainer side

    def produce(self, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        """The buffered batch of ``step`` (starting the rollout thread on first use)."""
        if self._thread is None:
            self._trained_cursor = self.cursor.state()
            self._thread = threading.Thread(target=self._produce_loop, args=(step,), name="relax-rollout", daemon=True)
            self._thread.start()
        t0 = time.monotonic()
        item = self._buffer.get()
        if isinstance(item, BaseException):
            raise item
        j, batch, metrics, cursor = item
        if j != step:
            raise RuntimeError(f"rollout buffer out of order: got step {j}, expected {step}")
        self._trained_cursor = cursor
        self._push_time = metrics.pop("perf/update_weights_time")
        metrics["perf/trainer_idle_time"] = time.monotonic() - t0
        return batch, metrics

    def step(self, step: int) -> dict[str, float]:
        metrics = super().step(step)
        metrics["perf/weights_post_time"] = metrics.pop("perf/update_weights_time", 0.0)
        metrics["perf/update_weights_time"] = self._push_time
        with self._cond:  # the weights of this step may have been posted: wake the rollout thread
            self._cond.notify_all()
        return metrics

    def evaluate(self, step: int) -> dict[str, float]:
        with self.c.engine.lock:
            self.c.engine.push_posted()
            return super().evaluate(step)

    def checkpoint_state(self) -> dict:
        state = super().checkpoint_state()
        if self._trained_cursor is not None:
            state["cursor"] = self._trained_cursor
        return state

    def run(self) -> int:
        try:
            return super().run()
        finally:
            self._stop_thread()
