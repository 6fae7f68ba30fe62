"""The reward stage: resolving the scorer, scoring a batch safely, post-processing.

    responses ──► score_batch(scorer, ...) ──► rewards [B] (None = unscored)
              ──► apply_processors(processors, RewardBatch) ──► rewards, keep ──► estimator

**Scorer resolution** (:func:`resolve_scorers`): ``--custom-rm-path pkg.module:fn`` uses that
function for every sample; ``--reward NAME`` uses the registered scorer ``NAME``; ``--reward
auto`` (the default) uses, for each sample, the scorer its data row names in
``metadata["scorer"]`` (the ``rg:`` source writes ``reasoning_gym``, GSM8K rows ``gsm8k``),
else ``math``.  ``--reward`` repeated gives one :class:`Scorer` per name, combined with
``--reward-weights`` (:mod:`relax_core.stages.reward_mix`).

``--custom-rm-path`` imports and runs your code with your own rights (the same as running a
Python script you wrote): it is the lighter alternative to writing a reward plugin, for quick
experiments.  It is only imported when you pass the flag.

**Safe scoring** (:func:`score_batch`): one reward per sample, in order, whatever happens.
A scorer call that raises, returns something other than a finite number or ``None``, kills
its worker, or runs past ``--reward-timeout`` seconds gives ``None`` for that sample and is
counted (``reward_errors`` / ``reward_timeouts``); the run goes on.  A *batched* scorer
(``RewardScorerSpec.batched``) gets all the samples of a batch that it scores in one call,
in one worker, with ``--reward-timeout`` for the whole call: a call that raises, times out,
kills its worker or returns a list of another length fails each of its samples (each
counted); a value that is not a finite number or ``None`` fails its own sample only.

Why processes, not threads.  Scorers run in a pool of ``--reward-num-workers`` worker
*processes* (``spawn``), each taking one sample at a time:

- isolation: a Python thread cannot be stopped, so a scorer stuck in a pathological sympy
  simplification would keep burning CPU (and the GIL) for the rest of the run; a worker
  process past its deadline is killed (SIGKILL) and replaced, so the batch never waits more
  than the timeout on one call and nothing leaks;
- parallelism: math-verify and reasoning-gym scoring are pure-Python CPU work that threads
  would serialise under the GIL;
- cost: ``benchmarks/reward_scoring.py`` (512 responses; results in
  ``benchmarks/results/reward_scoring.txt``): the pool adds about 0.2 ms of messaging per
  sample, against about 10 ms per sample for math-verify on the same (loaded) machine, and
  a one-off start-up of about 0.3 s per worker (plus the scorer's imports) when the first
  batch is scored; the pool is kept for the following batches.

Workers never receive built objects: names and config travel, not objects, as for Ray actors
and torchrun ranks (``docs/guide/writing-plugins.md``).
A :class:`Scorer` pickles as the scorer specs (dotted factory paths), the run config and the
custom path; each worker builds the per-sample scorer functions itself, *outside* the timed
call, so a cold import of math-verify does not count against ``--reward-timeout``.  A plain
callable is also accepted by :func:`score_batch` if it pickles by reference (a module-level
function of an importable module, as ``--custom-rm-path`` requires).

math-verify's own timeouts use ``signal.alarm``, which only works on a main thread: the
scorers call it with ``parsing_timeout=None`` / ``timeout_seconds=None`` and rely on the
deadline enforced here.

**Post-processors** (:func:`apply_processors`): applied in the order given by
``--reward-processor``, each ``process(RewardBatch) -> RewardBatch``.

This module imports nothing heavy at import time (torch only inside
:func:`apply_processors`).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import logging
import math
import multiprocessing as mp
import numbers
import pickle
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait as _wait_connections
from typing import Any, Callable, Mapping, Sequence

from relax_core.contracts import RewardBatch
from relax_core.run.interrupts import (
    SPAWN_TRIES,
    as_worker,
    killed_while_starting,
    messages,
    spawn_worker,
    stop_workers,
)
from relax_core.specs import RewardScorerSpec, api_notes

log = logging.getLogger("relax.rewarding")

ScorerFn = Callable[[str, Any, dict], "float | None"]

DEFAULT_SCORER = "math"
#: Seconds a fresh worker may take to start, and a scorer function to build (imports).
STARTUP_TIMEOUT = 120.0


class RewardSetupError(RuntimeError):
    """The scorer cannot run at all (unknown scorer name, unimportable custom path, a
    worker that cannot start): a configuration problem, not a per-sample failure."""


# --------------------------------------------------------------------------- resolution


def load_custom_scorer(path: str) -> ScorerFn:
    """Import ``pkg.module:fn`` and return ``fn`` (a scorer ``(response, label, metadata)
    -> float | None``).  Runs the module's import-time code with your rights.

    Raises:
        RewardSetupError: malformed path, module not importable, attribute missing or not
            callable.
    """
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr:
        raise RewardSetupError(f"--custom-rm-path must be 'pkg.module:function', got {path!r}")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise RewardSetupError(f"--custom-rm-path {path}: {type(e).__name__}: {e}") from None
    if not callable(obj):
        raise RewardSetupError(f"--custom-rm-path {path}: {type(obj).__name__} is not callable")
    return obj


class Scorer:
    """The run's scorer: picks, per sample, which scorer function applies, and builds each
    one lazily in the process that calls it (picklable; see the module docstring).

    Call it as ``scorer(response, label, metadata) -> float | None``, or use
    :meth:`resolve` to get the function for one sample without calling it.
    """

    def __init__(self, specs: Mapping[str, RewardScorerSpec], *, reward: str = "auto",
                 custom_rm_path: str | None = None, config: Any = None):
        self.specs = dict(specs)
        self.reward = reward
        self.custom_rm_path = custom_rm_path
        self.config = config
        self._built: dict[str, ScorerFn] = {}

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_built"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _built={})

    def name_for(self, metadata: Mapping | None) -> str:
        """The scorer name that applies to a sample with this metadata (``"custom"`` for
        ``--custom-rm-path``)."""
        if self.custom_rm_path:
            return "custom"
        if self.reward != "auto":
            return self.reward
        return (metadata or {}).get("scorer") or DEFAULT_SCORER

    def check(self, metadata: Sequence[Mapping | None]) -> None:
        """Make sure every scorer these samples need is installed and builds, building each
        once in this process (so that a typo in ``metadata['scorer']``, or ``remote``
        without ``--rm-url``, fails loudly before scoring instead of giving a run of
        unscored samples).

        Raises:
            RewardSetupError: naming the unknown scorers, or the one that cannot be built.
        """
        names = sorted({self.name_for(m) for m in metadata})
        unknown = [n for n in names if n != "custom" and n not in self.specs]
        if unknown:
            raise RewardSetupError(
                f"no reward scorer named {', '.join(map(repr, unknown))} (from --reward or the data's "
                f"metadata['scorer']); installed: {', '.join(sorted(self.specs)) or '(none)'}")
        for name in names:
            try:
                self._build(name)
            except RewardSetupError:
                raise
            except Exception as e:
                spec = self.specs.get(name)
                notes = api_notes("reward", spec.api_version) if spec is not None else ""
                raise RewardSetupError(f"reward scorer '{name}' cannot be built: {type(e).__name__}: {e}{notes}") from e

    def _build(self, name: str) -> ScorerFn:
        fn = self._built.get(name)
        if fn is None:
            if name == "custom":
                fn = load_custom_scorer(self.custom_rm_path)
            elif name not in self.specs:
                raise RewardSetupError(f"no reward scorer named '{name}'; installed: {', '.join(sorted(self.specs))}")
            else:
                params = self.config.params_for(name) if self.config is not None else None
                fn = self.specs[name].build(params, self.config)
            self._built[name] = fn
        return fn

    def resolve(self, metadata: Mapping | None) -> ScorerFn:
        """The scorer function for one sample, built on first use in this process.

        Raises:
            RewardSetupError: unknown scorer name or custom path.
            Exception: whatever the scorer's factory raises (e.g. ``remote`` without
                ``--rm-url``).
        """
        return self._build(self.name_for(metadata))

    def __call__(self, response: str, label: Any, metadata: dict | None) -> float | None:
        return self.resolve(metadata)(response, label, metadata or {})


def resolve_scorers(cfg: Any, registry: Any = None) -> list[Scorer]:
    """The scorers of a run, one per ``--reward`` in order (one for ``--custom-rm-path``),
    from the installed reward scorers.  Builds each fixed scorer once here so that a setup
    error (missing ``--rm-url``, bad custom path) stops the run before any model loads.

    Raises:
        RewardSetupError: ``--reward NAME`` together with ``--custom-rm-path``, an unknown
            ``--reward``, or a scorer that cannot be built.
    """
    if registry is None:
        from relax_core.host.plugins import default_registry

        registry = default_registry()
    specs = {name: reg.spec for name, reg in registry.components["reward"].items()}
    if cfg.custom_rm_path and tuple(cfg.reward) != ("auto",):
        raise RewardSetupError(f"--reward {' --reward '.join(cfg.reward)} and --custom-rm-path {cfg.custom_rm_path} "
                               "both choose the scorer: give only one")
    scorers = [Scorer(specs, reward=name, custom_rm_path=cfg.custom_rm_path, config=cfg) for name in cfg.reward]
    for scorer in scorers:
        scorer.check([{}])  # builds the custom, the fixed, or the default scorer
    return scorers


def build_processors(cfg: Any, registry: Any = None) -> list[Any]:
    """The ``--reward-processor`` objects, built in the order given."""
    if registry is None:
        from relax_core.host.plugins import default_registry

        registry = default_registry()
    out = []
    for name in cfg.reward_processor:
        spec = registry.get("reward_processor", name).spec
        out.append(spec.build(cfg.params_for(name), cfg))
    return out


# --------------------------------------------------------------------------- worker pool


def _as_reward(value: Any) -> float | None:
    """A scorer's return value as a reward: ``None`` stays ``None``; a finite real number
    becomes a float.  Raises ``TypeError``/``ValueError`` for anything else."""
    if value is None:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"scorer returned a non-finite reward {v}")
        return v
    raise TypeError(f"scorer returned {value!r} ({type(value).__name__}); expected a float or None")


def _batch_rewards(values: Any, n: int) -> list[tuple[float | None, str | None]]:
    """A batched scorer's return value as ``(reward, None)`` / ``(None, error)`` per sample.
    Raises ``TypeError`` when it is not a list of ``n`` values."""
    if not isinstance(values, (list, tuple)) or len(values) != n:
        got = f"{len(values)} values" if isinstance(values, (list, tuple)) else type(values).__name__
        raise TypeError(f"batched scorer returned {got} for {n} samples; expected a list of {n} floats or None")
    out: list[tuple[float | None, str | None]] = []
    for v in values:
        try:
            out.append((_as_reward(v), None))
        except (TypeError, ValueError) as e:
            out.append((None, f"{type(e).__name__}: {e}"))
    return out


def _worker_main(conn: Any, payload: bytes) -> None:
    """Worker process: unpickle the scorer, then score one sample per message.

    Messages in: ``(i, response, label, metadata)`` or ``None`` (stop); for a batched
    scorer ``i`` is a tuple of sample indices and the others are lists (one call).
    Messages out: ``("ready",)`` / ``("fatal", text)`` once, then per task
    ``("start", i)`` (the timed call begins) and ``("done", i, reward, counts)`` or
    ``("error", i, text)``; a batch's reward is a list of ``(reward, None)`` or
    ``(None, error text)`` pairs, one per sample; ``counts`` the scorer's own counts of the
    call (``RewardScorerSpec.counts``, ``{}`` for most scorers).

    A terminal's Ctrl-C sends SIGINT to the whole foreground process group, workers
    included: a worker ignores it (the parent finishes the step with every sample scored,
    then stops the workers).  It is already ignored while the worker starts (see
    :func:`relax_core.run.interrupts.spawn_worker`); :func:`~relax_core.run.interrupts.as_worker`
    covers a pool started off the main thread.
    """
    as_worker()
    try:
        scorer = pickle.loads(payload)
    except BaseException:  # noqa: BLE001 - reported to the parent
        conn.send(("fatal", traceback.format_exc(limit=4)))
        return
    conn.send(("ready",))
    for msg in messages(conn):
        i, response, label, metadata = msg
        try:
            # a batch's samples share one scorer (ScoringPool._tasks groups them by name)
            first = metadata[0] if isinstance(i, tuple) else metadata
            fn = scorer.resolve(first) if isinstance(scorer, Scorer) else scorer
        except Exception as e:  # noqa: BLE001
            conn.send(("error", i, f"building the scorer failed: {type(e).__name__}: {e}"))
            continue
        conn.send(("start", i))
        try:
            value = (_batch_rewards(fn(response, label, metadata), len(i)) if isinstance(i, tuple)
                     else _as_reward(fn(response, label, metadata)))
        except Exception as e:  # noqa: BLE001
            with contextlib.suppress(Exception):  # the failed call's counts are dropped (its samples are errors)
                _pop_counts(fn)
            conn.send(("error", i, f"{type(e).__name__}: {e}"))
            continue
        try:
            counts = _pop_counts(fn)
        except Exception as e:  # noqa: BLE001
            conn.send(("error", i, f"pop_counts failed: {type(e).__name__}: {e}"))
            continue
        conn.send(("done", i, value, counts))


def _pop_counts(fn: Any) -> dict[str, int]:
    """The counts a scorer function reports since its last call (``RewardScorerSpec.counts``:
    its ``pop_counts()``), as ``{name: int}``; ``{}`` when it has none."""
    pop = getattr(fn, "pop_counts", None)
    return {str(k): int(v) for k, v in pop().items()} if callable(pop) else {}


@dataclass
class _Worker:
    process: Any
    conn: Any
    ready: bool = False
    task: int | tuple[int, ...] | None = None
    deadline: float = math.inf
    started: bool = False
    tries: int = 1  # starts so far of this worker's slot that SIGINT killed while starting, plus one


class ScoringPool:
    """A pool of scorer worker processes, kept across batches.

    Args:
        scorer: a :class:`Scorer`, or a callable that pickles by reference.
        num_workers: worker processes (``--reward-num-workers``).

    Raises:
        RewardSetupError: the scorer cannot be pickled.
    """

    def __init__(self, scorer: Any, num_workers: int):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self._scorer = scorer
        try:
            self._payload = pickle.dumps(scorer)
        except Exception as e:
            raise RewardSetupError(
                f"the scorer {scorer!r} cannot be sent to reward workers ({type(e).__name__}: {e}); "
                "use a module-level function of an importable module (as --custom-rm-path does)") from None
        self._ctx = mp.get_context("spawn")
        self._lock = threading.Lock()
        self._workers = [self._start() for _ in range(num_workers)]

    def _start(self, tries: int = 1) -> _Worker:
        p, conn = spawn_worker(self._ctx, _worker_main, (self._payload,), "relax-reward-worker")
        return _Worker(p, conn, deadline=time.monotonic() + STARTUP_TIMEOUT, tries=tries)

    def _replace(self, w: _Worker, tries: int = 1) -> None:
        w.process.kill()
        w.process.join(timeout=5)
        w.conn.close()
        self._workers[self._workers.index(w)] = self._start(tries)

    def _tasks(self, metadata: Sequence[dict | None]) -> list[int | tuple[int, ...]]:
        """The calls to make: each sample alone, except that the samples of a batched scorer
        (``RewardScorerSpec.batched``) make one call, a tuple of their indices."""
        if not isinstance(self._scorer, Scorer):
            return list(range(len(metadata)))
        batches: dict[str, list[int]] = {}
        out: list[int | tuple[int, ...]] = []
        for i, m in enumerate(metadata):
            name = self._scorer.name_for(m)
            spec = self._scorer.specs.get(name)
            if getattr(spec, "batched", False):
                batches.setdefault(name, []).append(i)
            else:
                out.append(i)
        return [tuple(b) for b in batches.values()] + out

    def _name_of(self, task: int | tuple[int, ...], metadata: Sequence[dict | None]) -> str:
        """The scorer name of a task (a batched task's samples share one)."""
        first = task[0] if isinstance(task, tuple) else task
        return self._scorer.name_for(metadata[first]) if isinstance(self._scorer, Scorer) else "custom"

    def _declared_counts(self, metadata: Sequence[dict | None]) -> dict[str, int]:
        """``reward/<name>/<count>: 0`` for the counts declared by the scorers these samples use."""
        if not isinstance(self._scorer, Scorer):
            return {}
        names = dict.fromkeys(self._scorer.name_for(m) for m in metadata)
        return {f"reward/{n}/{c}": 0 for n in names for c in getattr(self._scorer.specs.get(n), "counts", ())}

    def score(self, responses: Sequence[str], labels: Sequence[Any], metadata: Sequence[dict | None],
              timeout: float) -> tuple[list[float | None], dict[str, int]]:
        """Score every sample (see :func:`score_batch`)."""
        n = len(responses)
        if not (len(labels) == n and len(metadata) == n):
            raise ValueError(f"responses, labels and metadata differ in length: {n}, {len(labels)}, {len(metadata)}")
        rewards: list[float | None] = [None] * n
        stats = {"reward_errors": 0, "reward_timeouts": 0, **self._declared_counts(metadata)}
        first_error: list[str] = []

        def fail(task: int | tuple[int, ...], kind: str, text: str) -> None:
            for i in task if isinstance(task, tuple) else (task,):
                stats[kind] += 1
                if not first_error:
                    first_error.append(f"sample {i}: {text}")

        with self._lock:
            if self.closed:
                raise RewardSetupError("this scoring pool is closed")
            todo = deque(self._tasks(metadata))
            while todo or any(w.task is not None for w in self._workers):
                now = time.monotonic()
                for w in list(self._workers):
                    while w.ready and w.task is None and todo:
                        i = todo.popleft()
                        try:
                            if isinstance(i, tuple):  # one call of a batched scorer
                                w.conn.send((i, [responses[j] for j in i], [labels[j] for j in i],
                                             [dict(metadata[j] or {}) for j in i]))
                            else:
                                w.conn.send((i, responses[i], labels[i], dict(metadata[i] or {})))
                        except (BrokenPipeError, ConnectionResetError):  # died while idle: retry elsewhere
                            todo.appendleft(i)
                            self._replace(w)
                            break
                        except Exception as e:  # noqa: BLE001 - the sample cannot be pickled
                            fail(i, "reward_errors", f"cannot send the sample to a worker: {type(e).__name__}: {e}")
                            continue
                        w.task, w.started, w.deadline = i, False, now + STARTUP_TIMEOUT
                # every worker is now busy or starting (finite deadlines), or all is done
                if not todo and all(w.task is None for w in self._workers):
                    break
                next_deadline = min(w.deadline for w in self._workers)
                wait_s = None if next_deadline == math.inf else max(0.0, next_deadline - now)
                for conn in _wait_connections([w.conn for w in self._workers], timeout=wait_s):
                    w = next(x for x in self._workers if x.conn is conn)
                    try:
                        msg = conn.recv()
                    except (EOFError, OSError):  # the worker died (segfault, os._exit, OOM kill)
                        if not w.ready:
                            interrupted = killed_while_starting(w.process)
                            if interrupted and w.tries < SPAWN_TRIES:
                                self._replace(w, w.tries + 1)  # a Ctrl-C in its start-up window
                                continue
                            self.close()
                            raise RewardSetupError(
                                f"a reward worker was killed by SIGINT while starting, {SPAWN_TRIES} times"
                                if interrupted else
                                "a reward worker exited while starting (workers are spawned: a script that "
                                "starts a run must guard it with `if __name__ == '__main__':`)") from None
                        if w.task is not None:
                            fail(w.task, "reward_errors", "the scorer's worker process died")
                        self._replace(w)
                        continue
                    if msg[0] == "ready":
                        w.ready, w.deadline = True, math.inf
                    elif msg[0] == "fatal":
                        self.close()
                        raise RewardSetupError(f"a reward worker could not load the scorer:\n{msg[1]}")
                    elif msg[0] == "start":
                        w.started, w.deadline = True, time.monotonic() + timeout
                    else:
                        kind, i, value, *counts = msg
                        for c, v in (counts[0] if counts else {}).items():
                            key = f"reward/{self._name_of(i, metadata)}/{c}"
                            stats[key] = stats.get(key, 0) + v
                        if kind == "done" and isinstance(i, tuple):
                            for j, (r, err) in zip(i, value):
                                rewards[j] = r
                                if err is not None:
                                    fail(j, "reward_errors", err)
                        elif kind == "done":
                            rewards[i] = value
                        else:
                            fail(i, "reward_errors", value)
                        w.task, w.deadline = None, math.inf
                now = time.monotonic()
                for w in list(self._workers):
                    if w.deadline <= now:
                        if w.task is None:
                            self.close()
                            raise RewardSetupError(f"a reward worker did not start within {STARTUP_TIMEOUT:.0f} s")
                        what = f"timed out after {timeout:g} s" if w.started else "building the scorer timed out"
                        fail(w.task, "reward_timeouts", what)
                        self._replace(w)
        if first_error:
            log.warning("reward scoring: %d error(s), %d timeout(s) in %d samples; first: %s",
                        stats["reward_errors"], stats["reward_timeouts"], n, first_error[0])
        return rewards, stats

    @property
    def closed(self) -> bool:
        return not self._workers

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        stop_workers(self._workers)
        self._workers = []

    def __enter__(self) -> "ScoringPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_POOLS: dict[tuple[bytes, int], ScoringPool] = {}
_POOLS_LOCK = threading.Lock()


def _pool_for(scorer: Any, num_workers: int) -> ScoringPool:
    """The cached pool for this scorer recipe and worker count (started on first use)."""
    try:
        key = (pickle.dumps(scorer), num_workers)
    except Exception:
        return ScoringPool(scorer, num_workers)  # raises the explanatory error
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None or pool.closed:
            pool = _POOLS[key] = ScoringPool(scorer, num_workers)
        return pool


@atexit.register
def shutdown_pools() -> None:
    """Stop every cached scoring pool (also run at interpreter exit)."""
    with _POOLS_LOCK:
        for pool in _POOLS.values():
            pool.close()
        _POOLS.clear()


def score_batch(scorer: Any, responses: Sequence[str], labels: Sequence[Any],
                metadata: Sequence[dict | None], *, timeout: float, num_workers: int,
                prompts: Sequence[str] | None = None, pool: Any = None) -> tuple[list[float | None], dict[str, int]]:
    """Score a batch: one reward per sample, in order.

    Args:
        scorer: a :class:`Scorer` (from :func:`resolve_scorers`) or a picklable callable
            ``(response, label, metadata) -> float | None``.
        responses / labels / metadata: per-sample, length ``B`` each.
        prompts: optional prompt texts (length ``B``), given to the scorers as
            ``metadata["prompt"]`` (the ``remote`` scorer sends it to the reward server).
        timeout: seconds one scorer call may take (``--reward-timeout``).
        num_workers: worker processes (``--reward-num-workers``); the pool is started on the
            first call and reused while the same scorer and worker count are used.
        pool: the pool to score in instead (a scorer's Ray actor:
            :class:`relax_core.distributed.scoring.ActorScoringPool`).

    Returns:
        ``(rewards, stats)``: ``rewards`` a list of ``B`` floats or ``None`` (unscored), in
        input order; ``stats`` ``{"reward_errors": n, "reward_timeouts": n}`` and, for a scorer
        that declares counts (``RewardScorerSpec.counts``), ``"reward/<name>/<count>": n``.

    Raises:
        RewardSetupError: a sample names a scorer that is not installed, the scorer cannot
            be pickled, or the workers cannot start.  Per-sample failures never raise.
    """
    if isinstance(scorer, Scorer):
        scorer.check(metadata)
    if prompts is not None:
        if len(prompts) != len(metadata):
            raise ValueError(f"prompts and metadata differ in length: {len(prompts)}, {len(metadata)}")
        metadata = [{**(m or {}), "prompt": p} for m, p in zip(metadata, prompts)]
    if not responses:
        return [], {"reward_errors": 0, "reward_timeouts": 0}
    return (pool or _pool_for(scorer, num_workers)).score(responses, labels, metadata, timeout)


# --------------------------------------------------------------------------- post-processing


def mean_over_rounds(rounds: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The post-processors' metrics of a whole step from those of its oversampling rounds.

    Every round post-processes a freshly generated batch of the same size
    (``--rollout-batch-size`` prompts × ``--n-samples-per-prompt``), and processor metrics
    are means over their batch (:class:`~relax_core.contracts.RewardBatch`), so the mean over
    the rounds is the metric over every sample (or group) generated in the step: e.g.
    ``rollout/filtered_group_frac`` = groups dropped in the step / groups generated in it.
    A metric that only some rounds report is averaged over those.
    """
    keys = {k for r in rounds for k in r}
    return {k: sum(r[k] for r in rounds if k in r) / sum(1 for r in rounds if k in r) for k in sorted(keys)}


def apply_processors(processors: Sequence[Any], batch: RewardBatch) -> RewardBatch:
    """Apply reward post-processors in order (``--reward-processor``, repeatable).

    Each ``process(RewardBatch) -> RewardBatch`` must keep the batch size ``B``: rewards
    float ``[B]`` (NaN = unscored), ``keep`` bool ``[B]``, and leave ``raw_rewards`` (the
    scorer's) as it found them.

    Raises:
        TypeError / ValueError: a processor returned something else, or changed
            ``raw_rewards``, naming it.
    """
    import torch

    n = int(batch.rewards.shape[0])
    for p in processors:
        out = p.process(batch)
        name = type(p).__name__
        if not isinstance(out, RewardBatch):
            raise TypeError(f"reward processor {name} returned {type(out).__name__}, expected RewardBatch")
        if tuple(out.rewards.shape) != (n,) or tuple(out.keep.shape) != (n,):
            raise ValueError(f"reward processor {name} changed the batch shape: rewards "
                             f"{tuple(out.rewards.shape)}, keep {tuple(out.keep.shape)}, expected ({n},)")
        if not out.rewards.is_floating_point() or out.keep.dtype != torch.bool:
            raise TypeError(f"reward processor {name} returned rewards {out.rewards.dtype} / keep "
                            f"{out.keep.dtype}; expected a float tensor and a bool tensor")
        if out.raw_rewards is not batch.raw_rewards and not (
                out.raw_rewards.shape == batch.raw_rewards.shape
                and torch.equal(out.raw_rewards.isnan(), batch.raw_rewards.isnan())
                and torch.equal(out.raw_rewards.nan_to_num(), batch.raw_rewards.nan_to_num())):
            raise ValueError(f"reward processor {name} changed raw_rewards (the scorer's rewards, read-only): "
                             "change rewards instead")
        batch = out
    return batch
