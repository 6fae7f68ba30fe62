"""Proxies that make Ray actors look like a local engine and backend.

:class:`RayEngine` satisfies :class:`~relax_core.contracts.RolloutEngine` over the
``--rollout-num-engines`` :class:`~relax_core.distributed.workers.EngineWorker` actors;
:class:`RayBackend` satisfies :class:`~relax_core.contracts.TrainBackend` over the
data-parallel :class:`~relax_core.distributed.workers.TrainWorker` ranks.  The driver's
:class:`~relax_core.trainer.Trainer` calls them exactly as it calls local objects.

Fault handling.  Engine actors are created with Ray actor restarts (``max_restarts``) and
no automatic task retries: when a ``generate`` call fails because its actor died, or comes
back from a restarted actor that no longer holds the current weights, :class:`RayEngine`
pushes the current weights to it and re-issues that call's prompts; a result is accepted
only from an actor holding the current weights, once per prompt, so no sample is lost or
counted twice.  A training rank that dies cannot be replaced mid-step (its peers wait in
collectives): :class:`RayBackend` raises :class:`TrainingWorkerDied` and the run stops; the
last checkpoint (``--save-interval``) is the resumable state (``--resume``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from relax_core.batch import concat_values
from relax_core.distributed.workers import loss_recipe, sampling_to_dict

#: attempts per generation chunk (1 + re-issues after an engine actor failure)
MAX_GENERATE_ATTEMPTS = 4
#: seconds to wait for a restarting engine actor (its constructor loads the model)
RESTART_TIMEOUT_S = 600.0


class TrainingWorkerDied(RuntimeError):
    """A training rank died; the run cannot continue (resume from the last checkpoint)."""


def split_even(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` consecutive ``[lo, hi)`` ranges covering ``range(n)``, sizes differing by
    at most one (the first ``n % parts`` ranges one longer)."""
    q, r = divmod(n, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + q + (i < r))
    return list(zip(bounds[:-1], bounds[1:]))


def chunk_seed(seed: int | None, chunk: int) -> int | None:
    """Generation seed of engine chunk ``chunk`` (chunk 0 keeps the step's seed, so one
    engine samples exactly what the local launcher samples)."""
    return None if seed is None else (int(seed) + 7919 * chunk) % (2**31 - 1)


class RayEngine:
    """A :class:`~relax_core.contracts.RolloutEngine` over engine actors.

    ``generate`` splits the prompts into one consecutive chunk per engine and runs the
    chunks concurrently; ``update_weights`` pushes one object-store copy of the weights to
    every engine (Ray serialises calls per actor, so a push lands between generation
    requests).

    Attributes:
        tokenizer: the model's tokenizer (loaded by the driver).
        version: the weight version every engine holds (0 = initial weights).
        restarts: generation chunks re-issued after an engine actor failed or restarted.
        colocate: offload engines after each generation (``--colocate``).
    """

    def __init__(self, actors: list[Any], tokenizer: Any, *, colocate: bool = False):
        self.actors = actors
        self.tokenizer = tokenizer
        self.pad_token_id = tokenizer.pad_token_id or 0
        self.colocate = colocate
        self.version = 0
        self.restarts = 0
        self._weights: Any = None  # ObjectRef of the current weights (None: initial weights)

    def generate(self, prompt_ids: list[list[int]], sampling: Any) -> Any:
        """Sample one response per prompt over the engines (see the class docstring).

        Raises:
            RuntimeError: a chunk failed :data:`MAX_GENERATE_ATTEMPTS` times.
        """
        import ray

        from relax_core.contracts import GenerationOutput

        ranges = [r for r in split_even(len(prompt_ids), len(self.actors)) if r[1] > r[0]]
        base = sampling_to_dict(sampling)
        args = [(prompt_ids[lo:hi], {**base, "seed": chunk_seed(base["seed"], i)}) for i, (lo, hi) in enumerate(ranges)]
        results: list[dict | None] = [None] * len(ranges)
        attempts = [1] * len(ranges)
        pending = {self.actors[i].generate.remote(*args[i]): i for i in range(len(ranges))}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            i = pending.pop(ready[0])
            try:
                out, version = ray.get(ready[0])
                failure = None if version == self.version else f"weights version {version} != {self.version} (restarted)"
            except ray.exceptions.RayActorError as e:
                out, failure = None, f"{type(e).__name__}: {e}"
            if failure is None:
                results[i] = out
                continue
            if attempts[i] >= MAX_GENERATE_ATTEMPTS:
                raise RuntimeError(f"rollout engine {i} failed {attempts[i]} times; last: {failure}")
            attempts[i] += 1
            self.restarts += 1
            self._revive(i)
            pending[self.actors[i].generate.remote(*args[i])] = i
        if self.colocate:
            ray.get([a.offload.remote() for a in self.actors])
        return GenerationOutput(**concat_values([r for r in results if r is not None], self.pad_token_id))

    def _await_restart(self, i: int) -> None:
        """Block until engine ``i`` answers again (Ray restarts a dead actor; calls made
        while it restarts fail with ``ActorUnavailableError``).

        Raises:
            RuntimeError: it did not come back within :data:`RESTART_TIMEOUT_S` or is dead
                for good (``max_restarts`` used up)."""
        import ray

        deadline = time.monotonic() + RESTART_TIMEOUT_S
        while True:
            try:
                ray.get(self.actors[i].ping.remote(), timeout=max(1.0, deadline - time.monotonic()))
                return
            except ray.exceptions.ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"rollout engine {i} did not restart within {RESTART_TIMEOUT_S:.0f} s") from None
                time.sleep(0.5)
            except (ray.exceptions.ActorDiedError, ray.exceptions.GetTimeoutError) as e:
                raise RuntimeError(f"rollout engine {i} is gone: {type(e).__name__}: {e}") from e

    def _revive(self, i: int) -> None:
        """Wait for engine ``i`` to be back and give it the current weights.

        Raises:
            RuntimeError: it failed again :data:`MAX_GENERATE_ATTEMPTS` times, or see
                :meth:`_await_restart`."""
        import ray

        for _ in range(MAX_GENERATE_ATTEMPTS):
            self._await_restart(i)
            if self._weights is None:  # a restarted engine holds the initial weights
                return
            try:
                ray.get(self.actors[i].update_weights.remote(self._weights, self.version))
                return
            except ray.exceptions.RayActorError:
                continue
        raise RuntimeError(f"rollout engine {i} could not take the weights of step {self.version}")

    def update_weights(self, state_dict: Any, version: int) -> None:
        """Push ``state_dict`` (a name → tensor dict, a LoRA
        :class:`~relax_core.contracts.AdapterWeights`, or an ``ObjectRef`` of either) to every
        engine; an engine that dies meanwhile gets it again after its restart."""
        import ray

        ref = state_dict if isinstance(state_dict, ray.ObjectRef) else ray.put(state_dict)
        self._weights, self.version = ref, int(version)
        calls = [a.update_weights.remote(ref, self.version) for a in self.actors]
        for i, call in enumerate(calls):
            try:
                ray.get(call)
            except ray.exceptions.RayActorError:
                self.restarts += 1
                self._revive(i)

    def shutdown(self) -> None:
        import ray

        for a in self.actors:
            try:
                ray.get(a.shutdown.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - an engine that died needs no shutdown
                pass


def data_parallel_layout(layout: list[tuple[int, int]]) -> tuple[int, list[int]]:
    """Check the ``(dp_rank, dp_size)`` reported by each training rank (in rank order) and
    return ``(dp_size, dp_rank per rank)``.

    Raises:
        ValueError: no ranks, ranks that disagree on ``dp_size``, or replicas that are
            missing, out of range or of unequal size (a model replica = the ranks sharing a
            ``dp_rank``)."""
    sizes = {n for _, n in layout}
    ranks = [d for d, _ in layout]
    if (len(sizes) != 1 or (n := sizes.pop()) < 1 or len(layout) % n
            or any(ranks.count(d) != len(layout) // n for d in range(n))):
        raise ValueError(f"the training ranks report an inconsistent data-parallel layout; (dp_rank, dp_size) "
                         f"per rank: {layout}")
    return n, ranks


class RayBackend:
    """A :class:`~relax_core.contracts.TrainBackend` over the training ranks.

    Each rank reports its data-parallel replica (:meth:`TrainWorker.data_parallel
    <relax_core.distributed.workers.TrainWorker.data_parallel>`: ``dp_rank`` of
    ``dp_size``; the ranks of one model replica, e.g. its tensor-parallel ranks, share a
    ``dp_rank``).  Every call shards the batch into ``dp_size`` consecutive,
    as-equal-as-possible pieces (``--global-batch-size`` is validated divisible), sends
    piece ``d`` to every rank of replica ``d``, and reads the results of each replica's
    first rank only (the others compute the same values).  ``accumulate_gradients`` sends
    the loss's recipe (settings and the *global* denominators); the backends' gradient
    all-reduce over the replicas sums the shards' gradients, so the core's optimizer step
    (:func:`relax_core.stages.optimizer.optimizer_step`, run by the driver over this proxy)
    equals one process on the whole batch.  The loss metrics of the replicas are contributions to
    global-batch values and are added back into the driver's loss object
    (``add_metrics``), whose ``metrics()`` the trainer reads.

    With ``--teacher-model`` the teacher is a worker of its own (``teacher``: a
    :class:`~relax_core.distributed.workers.TrainWorker` whose backend's ``actor`` is the
    frozen teacher, in its own placement): ``forward(role="teacher")`` sends it the whole
    batch, and the training ranks hold no copy of the teacher.

    Raises:
        ValueError: the ranks report an inconsistent layout (replicas of unequal size,
            missing or out-of-range ``dp_rank``).
    """

    def __init__(self, workers: list[Any], teacher: Any = None):
        import ray

        self.workers, self.teacher = workers, teacher
        self.world_size = len(workers)
        self.dp_size, self.dp_ranks = data_parallel_layout(ray.get([w.data_parallel.remote() for w in workers]))
        self.first = [self.dp_ranks.index(d) for d in range(self.dp_size)]  # reporting rank of each replica
        self.died = False

    def _all(self, calls: list[Any], who: str | None = None) -> list[Any]:
        """Results of one call per rank, in rank order (``who``: the worker named when it
        dies, for a call to a worker other than the training ranks).

        Raises:
            TrainingWorkerDied: a rank died (its peers may be blocked in a collective)."""
        import ray

        index = {c: r for r, c in enumerate(calls)}
        out: list[Any] = [None] * len(calls)
        pending = list(calls)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            r = index[ready[0]]
            try:
                out[r] = ray.get(ready[0])
            except ray.exceptions.RayActorError as e:
                self.died = True
                raise TrainingWorkerDied(f"{who or f'training worker rank {r} of {self.world_size}'} died "
                                         f"({type(e).__name__}); the run cannot continue without it") from e
        return out

    def _shards(self, batch: Any) -> list[dict]:
        """One shard per rank (the ranks of a replica share theirs)."""
        pieces = [batch.slice(lo, hi).to_dict() for lo, hi in split_even(batch.size, self.dp_size)]
        return [pieces[d] for d in self.dp_ranks]

    def _reporting(self, outs: list[Any]) -> list[Any]:
        """The results of each replica's first rank, in replica (= batch) order."""
        return [outs[r] for r in self.first]

    def forward(self, batch: Any, *, role: str = "actor", entropy: bool = False, top_k: bool = False) -> Any:
        import torch

        from relax_core.contracts import ForwardOutput

        if role == "teacher" and self.teacher is not None:  # its backend's actor is the teacher
            outs = self._all([self.teacher.forward.remote(batch.to_dict(), "actor", entropy, top_k)], who="the teacher")
        else:
            outs = self._reporting(self._all([w.forward.remote(s, role, entropy, top_k)
                                              for w, s in zip(self.workers, self._shards(batch))]))
        cat = {k: None if outs[0][k] is None else torch.cat([o[k] for o in outs]) for k in outs[0]}
        return ForwardOutput(**cat)

    def accumulate_gradients(self, batch: Any, loss_fn: Any, *, role: str = "actor") -> Any:
        """Forward and backward on every rank (see the class docstring) → the global batch's
        :class:`~relax_core.contracts.Gradients` from each replica's reporting rank: sums
        added over replicas, non-finite names joined, micro-batches added."""
        from relax_core.contracts import Gradients

        recipe = loss_recipe(loss_fn)
        outs = self._reporting(self._all([w.accumulate_gradients.remote(s, recipe, role)
                                          for w, s in zip(self.workers, self._shards(batch))]))
        sums: dict[str, float] = {}
        for grads, metrics in outs:
            for k, v in grads.sums.items():
                sums[k] = sums.get(k, 0.0) + v
            loss_fn.add_metrics(metrics)  # the driver's loss object reports the global-batch metrics
        return Gradients(sums=sums, nonfinite=frozenset().union(*(g.nonfinite for g, _ in outs)),
                         micro_batches=sum(g.micro_batches for g, _ in outs))

    def grad_norm(self, role: str = "actor") -> float:
        """The global gradient norm (a collective on every rank; equal on all, rank 0's read)."""
        return self._all([w.grad_norm.remote(role) for w in self.workers])[0]

    def apply_gradients(self, role: str = "actor", *, lr: float, grad_scale: float = 1.0) -> None:
        self._all([w.apply_gradients.remote(role, lr, grad_scale) for w in self.workers])

    def zero_grad(self, role: str = "actor") -> None:
        self._all([w.zero_grad.remote(role) for w in self.workers])

    def optimizer_steps(self, role: str = "actor") -> int:
        return self._all([self.workers[0].optimizer_steps.remote(role)])[0]

    def _replica0(self) -> list[Any]:
        """The ranks of replica 0, its reporting rank first (they call collectives together)."""
        return [w for w, d in zip(self.workers, self.dp_ranks) if d == 0]

    def engine_state_dict(self) -> Any:
        """An ``ObjectRef`` of replica 0's full weights (Hugging Face names), taken after
        the calls already sent to it; :class:`RayEngine` passes it on without a copy through
        the driver.  (With model parallelism every rank of replica 0 is called: they gather
        the shards together; the reporting rank's result is used.)"""
        refs = [w.engine_state_dict.remote() for w in self._replica0()]
        return refs[0]

    def engine_adapter(self) -> Any:
        """An ``ObjectRef`` of replica 0's LoRA adapter (:class:`~relax_core.contracts.AdapterWeights`),
        passed on like :meth:`engine_state_dict`'s weights."""
        refs = [w.engine_adapter.remote() for w in self._replica0()]
        return refs[0]

    def save_checkpoint(self, path: str, include_optimizer: bool = True) -> None:
        """The first replica writes (data-parallel replicas hold equal weights and
        optimizer states); ``path`` must be on storage the driver and those ranks share
        (multi-node: a shared file system)."""
        self._all([w.save_checkpoint.remote(str(Path(path).resolve()), include_optimizer)
                   for w in self._replica0()])

    def load_checkpoint(self, path: str) -> None:
        self._all([w.load_checkpoint.remote(str(Path(path).resolve())) for w in self.workers])

    def save_hf(self, path: str) -> None:
        self._all([w.save_hf.remote(str(Path(path).resolve())) for w in self._replica0()])

    def shutdown(self) -> None:
        import ray

        if self.died:  # the survivors may be blocked in a collective: the runtime kills them
            return
        for w in self.workers + ([self.teacher] if self.teacher is not None else []):
            try:
                ray.get(w.shutdown.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - a rank that died meanwhile needs no shutdown
                pass


def wait_alive(actors: list[Any], timeout: float = 600.0) -> float:
    """Block until every actor answers ``ping`` (constructors done); returns the seconds."""
    import ray

    t0 = time.monotonic()
    ray.get([a.ping.remote() for a in actors], timeout=timeout)
    return time.monotonic() - t0
