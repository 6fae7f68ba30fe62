"""Start or join Ray, reserve resources per role with placement groups, create the actors.

Resources (``--actor-*``, ``--rollout-*`` flags; CPU counts stand in for GPUs on CPU):

- training: ``--actor-num-nodes × --actor-num-gpus-per-node`` ranks, one bundle each
  (``{GPU: 1, CPU: 1}``, or ``{CPU: 1}`` on CPU), in one placement group (strategy
  ``PACK``: ranks fill a node before the next);
- rollout: ``--rollout-num-engines`` engines, one bundle each (``{GPU:
  --rollout-num-gpus-per-engine, CPU: 1}``, or ``{CPU: 1}`` on CPU), in a second group;
- teacher (``--teacher-model``, on-policy distillation): one worker in a group of its own
  (one bundle, ``{GPU: 1, CPU: 1}`` or ``{CPU: 1}``), whose backend's actor is the frozen
  teacher (:func:`teacher_config`); the training ranks do not load it;
- ``--colocate``: no rollout group; engine ``i`` runs in training bundle ``i mod ranks``
  and shares its devices (on GPU each engine asks for a fraction of the bundle's GPU and
  is offloaded after each generation when its plugin has ``offload()``/``onload()``; on
  CPU nothing needs offloading: the engine simply runs on the rank's CPU);
- reward scoring stays in the driver (the ``--reward-num-workers`` process pool of
  :mod:`relax_core.stages.rewarding`), which needs no placement, except for a scorer whose
  spec sets ``ray_num_gpus`` (a reward model): it gets a Ray actor of its own, with those
  GPUs and no CPU reservation (:mod:`relax_core.distributed.scoring`).

``--ray-address auto|<address>`` joins a running cluster (keep its token authentication
on); otherwise Relax starts a local Ray bound to 127.0.0.1 with enough logical CPUs for
the roles and stops it at the end.  A Ray already initialised in this process (tests) is
used as it is.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relax_core.distributed.proxies import RayBackend, RayEngine, TrainingWorkerDied, wait_alive

#: actor restarts of an engine (Ray ``max_restarts``)
ENGINE_MAX_RESTARTS = 3
#: share of a colocated GPU bundle given to the engine
COLOCATED_ENGINE_GPU_FRACTION = 0.2


@dataclass
class RayRuntime:
    """The Ray side of a run: proxies, actors and what to release at the end.

    Attributes:
        engine / backend: the protocol proxies the trainer calls.
        startup_s: seconds from ``ray.init`` to every actor built (Ray's start-up overhead
            plus model loads), also in ``run_info.json``.
    """

    engine: RayEngine
    backend: RayBackend
    startup_s: float
    engines: list[Any] = field(default_factory=list)
    workers: list[Any] = field(default_factory=list)
    groups: list[Any] = field(default_factory=list)
    started_ray: bool = False
    scorers: list[Any] = field(default_factory=list)

    def scorer_pools(self, scorers: list[Any], num_workers: int) -> list[Any]:
        """Per scorer, the :class:`~relax_core.distributed.scoring.ActorScoringPool` it runs
        in (its own Ray actor, started now) or ``None`` (the driver's reward workers); the
        actors are stopped by :meth:`shutdown`.

        Raises:
            RewardSetupError: an actor cannot get its GPUs or does not start."""
        from relax_core.distributed.scoring import ActorScoringPool, actor_gpus

        out = []
        for s in scorers:
            gpus = actor_gpus(s)
            out.append(None if gpus is None else ActorScoringPool(s, num_workers, gpus))
            if out[-1] is not None:
                self.scorers.append(out[-1])
        return out

    @staticmethod
    def worker_died(e: BaseException) -> bool:
        """Whether ``e`` says a training rank died (the run cannot continue)."""
        return isinstance(e, TrainingWorkerDied)

    def shutdown(self) -> None:
        """Stop the actors, free the placement groups, stop Ray if Relax started it."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for pool in self.scorers:
            pool.close()
        self.backend.shutdown()
        for a in self.engines + self.workers:
            ray.kill(a, no_restart=True)
        for g in self.groups:
            remove_placement_group(g)
        if self.started_ray:
            ray.shutdown()


def worker_config(config_dict: dict) -> dict:
    """The config dict for workers: local model paths made absolute (a worker's working
    directory is not the driver's)."""
    out = dict(config_dict)
    for key in ("model", "ref_load", "teacher_model"):
        v = out.get(key)
        if v and Path(v).expanduser().exists():
            out[key] = str(Path(v).expanduser().resolve())
    return out


def teacher_config(config: dict) -> dict:
    """The teacher worker's config: the run's, with ``--teacher-model`` as the model (its
    backend's ``actor``, only ever run forward, no gradient), no LoRA, reference or teacher of
    its own; its log-probs are then computed exactly as the actor's (same backend, layout,
    temperature and float32 log-softmax)."""
    return dict(config, model=config["teacher_model"], teacher_model=None, ref_load=None, lora_rank=0)


def init_ray(cfg: Any, cpus_needed: int) -> bool:
    """Start or join Ray; returns whether this call started it (and must stop it)."""
    import ray

    if ray.is_initialized():
        return False
    if cfg.ray_address:
        ray.init(address=cfg.ray_address, log_to_driver=not cfg.quiet)
        return False
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private local cluster on 127.0.0.1
    ray.init(num_cpus=max(cpus_needed, os.cpu_count() or 1), include_dashboard=False,
             _node_ip_address="127.0.0.1", log_to_driver=not cfg.quiet)
    return True


def start_train_group(config: dict, world: int, setup: dict, corrections: list[str],
                      options: list[dict]) -> list[Any]:
    """Create ``world`` :class:`~relax_core.distributed.workers.TrainWorker` ranks (Ray
    actor ``options`` per rank: resources, placement) and form their torch.distributed
    group; returns the actor handles in rank order once every rank has joined."""
    import ray

    from relax_core.distributed.workers import TrainWorker

    train = ray.remote(max_restarts=0)(TrainWorker)
    workers = [train.options(**options[r]).remote(config, r, world) for r in range(world)]
    wait_alive(workers)
    host, port = ray.get(workers[0].address.remote())
    ray.get([w.init_group.remote(host, port) for w in workers])
    ray.get([w.configure.remote(config, setup, corrections) for w in workers])
    return workers


def start_ray(cfg: Any, config_dict: dict, *, setup: dict, corrections: list[str], tokenizer: Any) -> RayRuntime:
    """Create the run's actors and proxies (see the module docstring).

    Args:
        cfg: the validated :class:`~relax_core.config.RunConfig`.
        config_dict: :func:`~relax_core.config.config_to_dict` of it (sent to workers).
        setup: the backend's ``setup`` flags (``needs_ref``, ``needs_critic``,
            ``needs_top_k``, ``routing_replay``).
        corrections: correction names in application order.
        tokenizer: the driver's tokenizer (prompts, padding).

    Raises:
        RuntimeError (from Ray): resources that the cluster cannot provide; an actor
            constructor error (e.g. a model that does not load) re-raised from the actor.
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from relax_core.distributed.workers import EngineWorker

    t0 = time.monotonic()
    world = cfg.actor_num_nodes * cfg.actor_num_gpus_per_node
    n_engines = cfg.rollout_num_engines
    teacher = 1 if cfg.teacher_model else 0
    started = init_ray(cfg, world + (0 if cfg.colocate else n_engines) + teacher)
    gpu = cfg.device == "cuda" or (cfg.device == "auto" and ray.cluster_resources().get("GPU", 0) > 0)
    wcfg = worker_config(config_dict)
    if teacher:
        teacher_cfg, wcfg = teacher_config(wcfg), dict(wcfg, teacher_model=None)

    train_pg = placement_group([{"CPU": 1, **({"GPU": 1} if gpu else {})}] * world, strategy="PACK")
    groups = [train_pg]
    if cfg.colocate:
        engine_pg, engine_bundle = train_pg, [i % world for i in range(n_engines)]
        engine_res = {"num_cpus": 0, "num_gpus": COLOCATED_ENGINE_GPU_FRACTION if gpu else 0}
    else:
        g = cfg.rollout_num_gpus_per_engine
        engine_pg = placement_group([{"CPU": 1, **({"GPU": g} if gpu else {})}] * n_engines, strategy="PACK")
        groups.append(engine_pg)
        engine_bundle = list(range(n_engines))
        engine_res = {"num_cpus": 1, "num_gpus": g if gpu else 0}
    if teacher:
        teacher_pg = placement_group([{"CPU": 1, **({"GPU": 1} if gpu else {})}])
        groups.append(teacher_pg)
    ray.get([pg.ready() for pg in groups], timeout=600)

    def at(pg: Any, i: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i)

    train_res = {"num_cpus": 1, "num_gpus": (1 - engine_res["num_gpus"] if cfg.colocate else 1) if gpu else 0}
    engine_actor = ray.remote(max_restarts=ENGINE_MAX_RESTARTS, max_task_retries=0)(EngineWorker)
    engines = [engine_actor.options(scheduling_strategy=at(engine_pg, engine_bundle[i]), **engine_res).remote(wcfg, i)
               for i in range(n_engines)]
    workers: list[Any] = []
    try:
        workers = start_train_group(wcfg, world, setup, corrections,
                                    [dict(scheduling_strategy=at(train_pg, r), **train_res) for r in range(world)])
        if teacher:
            workers += start_train_group(teacher_cfg, 1, {}, [], [dict(scheduling_strategy=at(teacher_pg, 0),
                                                                        num_cpus=1, num_gpus=1 if gpu else 0)])
        backend = RayBackend(workers[:world], teacher=workers[world] if teacher else None)
        if backend.dp_size != cfg.data_parallel_size:
            raise RuntimeError(f"--train-backend {cfg.train_backend} formed {backend.dp_size} data-parallel replicas over "
                               f"{world} training workers, but the run's flags give {cfg.data_parallel_size} "
                               f"(workers / model-parallel size {cfg.model_parallel_size})")
        wait_alive(engines)
    except BaseException:
        for a in engines + workers:
            ray.kill(a, no_restart=True)
        for g in groups:
            remove_placement_group(g)
        if started:
            ray.shutdown()
        raise
    engine = RayEngine(engines, tokenizer, colocate=cfg.colocate)
    return RayRuntime(engine=engine, backend=backend, startup_s=time.monotonic() - t0, engines=engines, workers=workers, groups=groups,
                      started_ray=started)
