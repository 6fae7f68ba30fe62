"""``--launcher ray``: rollout engines and training workers as Ray actors.

Layout of a run (one driver process, the ``relax train`` process)::

    driver ── the Trainer loop, with a SyncSource or (--fully-async) an AsyncSource whose
      │        rollout thread runs ahead (relax_core.stages.rollout)
      │        reward scoring: the driver's relax_core.stages.rewarding pool (--reward-num-workers)
      ├── RayEngine  (RolloutEngine proxy) ── EngineWorker actor × --rollout-num-engines
      └── RayBackend (TrainBackend proxy)  ── TrainWorker actor × (--actor-num-nodes ×
                                               --actor-num-gpus-per-node), one
                                               torch.distributed group (gloo / NCCL);
                                               data-parallel replicas of TP × CP × PP
                                               ranks each (as the backend reports)

Workers receive names and a JSON-able config dict and build their components themselves
from the installed entry points (:func:`relax_core.host.plugins.default_registry`); only tensors
and plain data cross process boundaries.  The proxies satisfy the same protocols as a local
engine and backend, so the unchanged :class:`relax_core.trainer.Trainer` drives every
mode.  Modules: :mod:`.workers` (actor classes), :mod:`.proxies` (protocol proxies, fault
handling), :mod:`.runtime` (cluster start/join, placement groups, actor creation).
"""
