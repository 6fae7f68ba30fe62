"""The Ray actor classes: a rollout engine (:class:`EngineWorker`) and one data-parallel
rank of the training group (:class:`TrainWorker`).

Both are plain classes (wrapped with ``ray.remote`` by :mod:`relax_core.distributed.runtime`),
constructed from the run's JSON-able config dict (:func:`relax_core.config.config_to_dict`),
which each rebuilds into a :class:`~relax_core.config.RunConfig` and uses to build its
components by name from the installed entry points.  Arguments and results are tensors and
plain data (dicts, lists, numbers): no plugin object is pickled.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import fields
from typing import Any

from relax_core.batch import Batch
from relax_core.config import resolve_device

#: seconds a collective of the training group waits for a missing rank before failing
GROUP_TIMEOUT_S = 600


def config_from_dict(config: dict) -> Any:
    """Rebuild the run's :class:`~relax_core.config.RunConfig` from
    :func:`~relax_core.config.config_to_dict` output, with this process's registry.

    Raises:
        ConfigError: a key or value this process's plugins do not know (a worker with other
            plugin versions than the driver).
    """
    from relax_core.config import build_config
    from relax_core.host.plugins import default_registry

    values = dict(config)
    params = values.pop("plugin_params", {}) or {}
    cli = {f"{comp}.{name}": v for comp, ps in params.items() for name, v in ps.items()}
    return build_config(cli=cli, yaml_values=values, param_schemas=default_registry().param_schemas(),
                        yaml_source="driver config")


def build_component(kind: str, name: str, cfg: Any) -> Any:
    """Build the component ``name`` of ``kind`` from its spec, as the local launcher does."""
    from relax_core.host.plugins import default_registry

    return default_registry().get(kind, name).spec.build(cfg.params_for(name), cfg)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- rollout engine


def sampling_to_dict(sampling: Any) -> dict:
    return {f.name: getattr(sampling, f.name) for f in fields(sampling)}


class EngineWorker:
    """One rollout engine (any engine plugin, ``--rollout-engine``) in its own actor.

    Attributes:
        version: trainer step whose weights the engine holds (0 = the initial weights; a
            restarted actor is back at 0 until the driver pushes the current weights).
    """

    def __init__(self, config: dict, index: int):
        import torch

        cfg = config_from_dict(config)
        torch.manual_seed(cfg.seed + index)
        self.index = index
        self.engine = build_component("engine", cfg.rollout_engine, cfg)
        self.version = 0
        self.offloaded = False

    def ping(self) -> int:
        return os.getpid()

    def generate(self, prompt_ids: list[list[int]], sampling: dict) -> tuple[dict, int]:
        """``engine.generate`` → (the :class:`~relax_core.contracts.GenerationOutput`'s
        fields as a dict, the weight version that generated them)."""
        from relax_core.contracts import SamplingParams

        self.onload()
        out = self.engine.generate(prompt_ids, SamplingParams(**sampling))
        return out.items(), self.version

    def update_weights(self, state_dict: dict, version: int) -> int:
        self.onload()
        self.engine.update_weights(state_dict, version)
        self.version = int(version)
        return self.version

    def offload(self) -> bool:
        """Release the engine's device memory (``--colocate``) when the engine plugin has an
        ``offload()`` method; returns whether it did."""
        fn = getattr(self.engine, "offload", None)
        if callable(fn) and not self.offloaded:
            fn()
            self.offloaded = True
        return self.offloaded

    def onload(self) -> None:
        if self.offloaded:
            self.engine.onload()
            self.offloaded = False

    def shutdown(self) -> None:
        fn = getattr(self.engine, "shutdown", None)
        if callable(fn):
            fn()


# --------------------------------------------------------------------------- training rank


def loss_recipe(loss_fn: Any) -> dict:
    """What a rank needs to rebuild the driver's :class:`~relax_core.stages.loss.ActorLoss` or
    :class:`~relax_core.stages.loss.CriticLoss` with its own estimator and corrections: the
    settings and the *global* batch's denominators (plain data).

    Raises:
        TypeError: another loss function (only the core's losses can be rebuilt by name).
    """
    from dataclasses import asdict

    from relax_core.stages.loss import ActorLoss, CriticLoss

    if isinstance(loss_fn, ActorLoss):
        return {"kind": "actor", "settings": asdict(loss_fn.s), "num_tokens": loss_fn.num_tokens,
                "num_samples": loss_fn.num_samples, "old_from_current": loss_fn.old_from_current}
    if isinstance(loss_fn, CriticLoss):
        return {"kind": "critic", "settings": asdict(loss_fn.s), "num_tokens": loss_fn.num_tokens,
                "num_samples": loss_fn.num_samples}
    raise TypeError(f"--launcher ray trains with relax_core.stages.loss.ActorLoss/CriticLoss, not {type(loss_fn).__name__}")


class TrainWorker:
    """Rank ``rank`` of the training group: the training backend (``--train-backend``),
    the estimator and the corrections, built by name.

    The ranks form data-parallel replicas of the model (with tensor/context/pipeline
    parallelism, several ranks hold one replica).  The backend says where this rank sits:
    its optional ``data_parallel() -> (dp_rank, dp_size, dp_group)`` (megatron: from
    Megatron's parallel state); a backend without it is pure data parallel: ``(rank,
    world_size, the whole group)`` (torch).  Each replica trains on its shard of every
    optimizer step's global batch with the global denominators
    (:func:`relax_core.stages.loss.global_denominators` of the whole batch, computed by the
    driver), so the backend's gradient all-reduce over the replicas (a sum) gives the
    one-process gradient; estimator statistics that span the batch are reduced over the
    data-parallel group (``PolicyLossInput.process_group``), never over the ranks of one
    replica, which hold the same samples.

    Life cycle: ``TrainWorker(config, rank, world_size)`` → :meth:`init_group` →
    :meth:`configure` (``setup``: keyword arguments of the backend's ``setup``:
    ``needs_ref``, ``needs_critic``, ``needs_top_k``, ``routing_replay``; the critic
    settings come from this rank's estimator; ``corrections``: names in application order).
    """

    def __init__(self, config: dict, rank: int, world_size: int):
        self.cfg = config_from_dict(config)
        self.rank, self.world_size = rank, world_size
        self.dp_rank, self.dp_size, self.group = 0, 1, None

    def configure(self, config: dict, setup: dict, corrections: list[str]) -> None:
        """Build the estimator, corrections and backend for ``config``, after
        :meth:`init_group` (a backend such as megatron sets up its own parallel groups
        inside the world it finds); called again, it builds another run's components on
        the same group."""
        import torch

        cfg = self.cfg = config_from_dict(config)
        torch.manual_seed(cfg.seed)
        self.estimator = build_component("estimator", cfg.advantage_estimator, cfg)
        self.corrections = [build_component("correction", name, cfg) for name in corrections]
        self.backend = build_component("backend", cfg.train_backend, cfg)
        critic_settings = getattr(self.estimator, "critic_settings", None) if setup.get("needs_critic") else None
        self.backend.setup(critic_settings=critic_settings, **setup)
        layout = getattr(self.backend, "data_parallel", None)
        if callable(layout):
            self.dp_rank, self.dp_size, self.group = layout()
        else:
            import torch.distributed as dist

            self.dp_rank, self.dp_size = self.rank, self.world_size
            self.group = dist.group.WORLD if self.world_size > 1 else None

    def data_parallel(self) -> tuple[int, int]:
        """``(dp_rank, dp_size)``: this rank's replica and the number of replicas (after
        :meth:`configure`)."""
        return self.dp_rank, self.dp_size

    def ping(self) -> int:
        return os.getpid()

    def address(self) -> tuple[str, int]:
        """This node's address and a free port (rank 0: the group's rendezvous)."""
        import ray

        return ray.util.get_node_ip_address(), _free_port()

    def init_group(self, host: str, port: int) -> None:
        """Join the torch.distributed group (gloo on CPU, NCCL on CUDA)."""
        import torch.distributed as dist

        if self.world_size == 1:
            return
        backend = "nccl" if resolve_device(self.cfg.device) == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=self.rank,
                                world_size=self.world_size, timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))

    def _loss(self, recipe: dict) -> Any:
        from relax_core.stages.loss import ActorLoss, CriticLoss, LossSettings

        settings = LossSettings(**recipe["settings"])
        if recipe["kind"] == "critic":
            return CriticLoss(self.estimator, settings, num_tokens=recipe["num_tokens"],
                              num_samples=recipe["num_samples"])
        return ActorLoss(self.estimator, self.corrections, settings, num_tokens=recipe["num_tokens"],
                         num_samples=recipe["num_samples"], old_from_current=recipe["old_from_current"],
                         process_group=self.group)

    def forward(self, batch: dict, role: str, entropy: bool, top_k: bool) -> dict:
        out = self.backend.forward(Batch.from_dict(batch), role=role, entropy=entropy, top_k=top_k)
        return {f.name: getattr(out, f.name) for f in fields(out)}

    def accumulate_gradients(self, batch: dict, recipe: dict, role: str) -> tuple[Any, dict]:
        """Forward and backward of this rank's shard (the backend all-reduces the gradients)
        → (the backend's :class:`~relax_core.contracts.Gradients`, the loss's global-batch
        metric *contributions* of this shard)."""
        loss_fn = self._loss(recipe)
        grads = self.backend.accumulate_gradients(Batch.from_dict(batch), loss_fn, role=role)
        return grads, loss_fn.metrics()

    def grad_norm(self, role: str) -> float:
        return self.backend.grad_norm(role)

    def apply_gradients(self, role: str, lr: float, grad_scale: float) -> None:
        self.backend.apply_gradients(role, lr=lr, grad_scale=grad_scale)

    def zero_grad(self, role: str) -> None:
        self.backend.zero_grad(role)

    def optimizer_steps(self, role: str) -> int:
        return self.backend.optimizer_steps(role)

    def gradients(self, batch: dict, recipe: dict, role: str = "actor") -> tuple[dict, dict, dict]:
        """Forward and backward without an optimizer step (the data-parallel check):
        → (summed loss and metrics of this shard, the all-reduced gradients by parameter
        name, the loss's metric contributions).  Gradients are cleared afterwards."""
        loss_fn = self._loss(recipe)
        acc = self.backend.accumulate_gradients(Batch.from_dict(batch), loss_fn, role=role)
        model = self.backend.models[role]
        grads = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
        self.backend.zero_grad(role)
        return acc.sums, grads, loss_fn.metrics()

    def compute_advantages(self, inp: dict) -> dict:
        """The estimator's ``compute_advantages`` on this rank's shard with the data-parallel
        group as ``process_group`` (for estimators whose contract reduces over ranks, e.g.
        REINFORCE++'s global normalisation)."""
        from relax_core.contracts import AdvantageInput

        out = self.estimator.compute_advantages(AdvantageInput(**inp, process_group=self.group))
        return {"advantages": out.advantages, "returns": out.returns, "normalized": out.normalized}

    def engine_state_dict(self) -> dict:
        return {k: v.detach().cpu().clone() for k, v in self.backend.engine_state_dict().items()}

    def engine_adapter(self) -> Any:
        return self.backend.engine_adapter()  # CPU tensors by contract (AdapterWeights); Ray copies the object

    def save_checkpoint(self, path: str, include_optimizer: bool = True) -> None:
        self.backend.save_checkpoint(path, include_optimizer=include_optimizer)

    def load_checkpoint(self, path: str) -> None:
        self.backend.load_checkpoint(path)

    def save_hf(self, path: str) -> None:
        self.backend.save_hf(path)

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
