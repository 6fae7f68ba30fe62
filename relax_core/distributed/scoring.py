"""Scorers in Ray actors of their own (``--launcher ray``).

A scorer whose spec sets ``ray_num_gpus`` (a model reward: ``reward_model``) is not scored in
the driver's reward workers but by a :class:`ScorerWorker` actor, created at start-up with the
GPUs the spec asks for (``ray_num_gpus(params)``: one for ``--reward-model-device cuda``, none
on CPU) and no CPU reservation (so it never competes with the training and rollout placement
groups).  The actor runs the same :class:`~relax_core.stages.rewarding.ScoringPool` the driver
would (``--reward-num-workers`` worker processes, ``--reward-timeout`` per call, every
failure counted per sample), so scoring means the same thing on both sides; the processes it
spawns inherit the actor's devices.

The driver side, :class:`ActorScoringPool`, has the pool's interface (``score``, ``close``,
``closed``) and is what :func:`relax_core.stages.rewarding.score_batch` calls.  An actor that
dies (or stops answering) fails the samples of that call (``reward_errors``, counted, never
scored as 0) and is replaced before the next call.
"""

from __future__ import annotations

import logging
import os
import pickle
from typing import Any, Sequence

from relax_core.stages.rewarding import STARTUP_TIMEOUT, RewardSetupError, ScoringPool

log = logging.getLogger(__name__)

#: seconds a scoring call may take beyond its samples' own ``--reward-timeout`` before the
#: actor is taken for stuck (the pool in it enforces the per-call timeouts)
STUCK_MARGIN = 60.0


class ScorerWorker:
    """The actor: a :class:`ScoringPool` of the pickled scorer (wrapped with ``ray.remote``)."""

    def __init__(self, payload: bytes, num_workers: int):
        self.pool = ScoringPool(pickle.loads(payload), num_workers)

    def ping(self) -> int:
        return os.getpid()

    def score(self, responses: list[str], labels: list[Any], metadata: list[dict],
              timeout: float) -> tuple[list[float | None], dict[str, int]]:
        return self.pool.score(responses, labels, metadata, timeout)

    def shutdown(self) -> None:
        self.pool.close()


def actor_gpus(scorer: Any) -> float | None:
    """The GPUs of the actor a :class:`~relax_core.stages.rewarding.Scorer` runs in under
    Ray (its spec's ``ray_num_gpus`` of its parameters), or ``None`` when it is scored in the
    driver (no ``ray_num_gpus``; ``--reward auto`` and ``--custom-rm-path``, whose scorer is
    chosen per sample)."""
    spec = getattr(scorer, "specs", {}).get(getattr(scorer, "reward", None))
    if spec is None or spec.ray_num_gpus is None or scorer.custom_rm_path:
        return None
    params = scorer.config.params_for(scorer.reward) if scorer.config is not None else None
    return float(spec.ray_num_gpus(params))


class ActorScoringPool:
    """The driver's handle of one :class:`ScorerWorker` (see the module docstring).

    Args:
        scorer: the :class:`~relax_core.stages.rewarding.Scorer`.
        num_workers: ``--reward-num-workers`` (processes inside the actor).
        num_gpus: the actor's GPUs (:func:`actor_gpus`).

    Raises:
        RewardSetupError: the cluster has fewer GPUs than asked for, or the actor cannot
            start (its error is named).
    """

    def __init__(self, scorer: Any, num_workers: int, num_gpus: float):
        import ray

        have = ray.cluster_resources().get("GPU", 0.0)
        if num_gpus > have:
            raise RewardSetupError(
                f"reward scorer '{scorer.reward}' needs {num_gpus:g} GPU(s) for its Ray actor and the cluster has "
                f"{have:g}; use --reward-model-device cpu, or give the cluster a GPU for it")
        self.name, self.num_gpus, self.num_workers = scorer.reward, num_gpus, num_workers
        self._payload = pickle.dumps(scorer)
        self.actor: Any = None
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        import ray

        cls = ray.remote(max_restarts=0, max_task_retries=0)(ScorerWorker)
        self.actor = cls.options(num_cpus=0, num_gpus=self.num_gpus).remote(self._payload, self.num_workers)
        try:
            self.pid = ray.get(self.actor.ping.remote(), timeout=STARTUP_TIMEOUT)
        except Exception as e:
            self.close()
            raise RewardSetupError(f"the Ray actor of reward scorer '{self.name}' did not start: "
                                   f"{type(e).__name__}: {e}") from None

    def score(self, responses: Sequence[str], labels: Sequence[Any], metadata: Sequence[dict | None],
              timeout: float) -> tuple[list[float | None], dict[str, int]]:
        """:meth:`ScoringPool.score` in the actor; an actor that dies or is stuck fails
        every sample of the call (``reward_errors``) and is replaced."""
        import ray

        n = len(responses)
        limit = STARTUP_TIMEOUT + timeout * n + STUCK_MARGIN
        ref = self.actor.score.remote(list(responses), list(labels), list(metadata), timeout)
        try:
            return ray.get(ref, timeout=limit)  # a RewardSetupError inside the actor is raised as it is
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
            log.warning("reward scoring: the Ray actor of '%s' failed (%s); its %d samples are unscored, and it is "
                        "replaced", self.name, type(e).__name__, n)
            ray.kill(self.actor, no_restart=True)
            self.restarts += 1
            self._start()
            return [None] * n, {"reward_errors": n, "reward_timeouts": 0}

    @property
    def closed(self) -> bool:
        return self.actor is None

    def close(self) -> None:
        """Stop the actor's pool and the actor (idempotent)."""
        import ray

        if self.actor is None:
            return
        try:
            ray.get(self.actor.shutdown.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - already dead or stuck: killed below
            pass
        ray.kill(self.actor, no_restart=True)
        self.actor = None
