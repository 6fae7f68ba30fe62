"""One optimizer step, written once for every backend.

The backend (:class:`~relax_core.contracts.TrainBackend`) runs forward and backward over its
micro-batches and its collectives; this module decides the step::

    grads = backend.accumulate_gradients(batch, loss_fn)     gradients summed, reduced over ranks
    g     = backend.grad_norm()                              ‖∇‖₂ over all ranks
    skip  = any loss, metric or g not finite                 (on any rank)
    lr    = base_lr · min(1, (s + 1) / W)                    warm-up, s = steps applied, W = --lr-warmup-steps
    c     = min(1, max_norm / (g + 1e-6))                    clip, max_norm = --clip-grad (0 = off)
    backend.apply_gradients(lr=lr, grad_scale=c)             unless skip
    backend.zero_grad()

The clip coefficient is computed in float32 (``torch.nn.utils.clip_grad_norm_``'s
arithmetic), so a backend's clipped gradients are the same numbers as torch's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from relax_core.contracts import StepResult


@dataclass(frozen=True)
class OptimizerSettings:
    """The run's optimizer-step options (from :class:`~relax_core.config.RunConfig`).

    Attributes:
        lr: ``--lr``, the actor's base learning rate.
        critic_lr: the critic's (the estimator's ``CriticSettings.lr``, default ``--lr``).
        warmup_steps: ``--lr-warmup-steps`` (0 = none).
        clip_grad: ``--clip-grad``, the gradient-norm bound (0 = no clipping).
    """

    lr: float
    critic_lr: float
    warmup_steps: int
    clip_grad: float

    @classmethod
    def from_config(cls, cfg: Any, critic_settings: Any = None) -> "OptimizerSettings":
        critic_lr = getattr(critic_settings, "lr", None) or cfg.lr
        return cls(lr=cfg.lr, critic_lr=critic_lr, warmup_steps=cfg.lr_warmup_steps, clip_grad=cfg.clip_grad)

    def lr_at(self, role: str, steps: int) -> float:
        """Learning rate of ``role``'s next step after ``steps`` applied ones: linear warm-up
        ``base · (s + 1) / W`` for ``s < W``, then ``base``.

        Raises:
            ValueError: ``role`` is neither ``actor`` nor ``critic``.
        """
        if role not in ("actor", "critic"):
            raise ValueError(f"train role must be 'actor' or 'critic', got {role!r}")
        base = self.lr if role == "actor" else self.critic_lr
        w = self.warmup_steps
        return base * (min(1.0, (steps + 1) / w) if w > 0 else 1.0)


def clip_coefficient(grad_norm: float, max_norm: float) -> float:
    """The factor ``min(1, max_norm / (grad_norm + 1e-6))`` that brings the gradient's norm
    down to ``max_norm`` (float32 arithmetic; 1 when ``max_norm`` is 0, no clipping).

    Example: ``clip_coefficient(4.0, 1.0)`` = float32(1 / 4.000001) ≈ 0.24999994;
    ``clip_coefficient(0.5, 1.0)`` = 1.0.
    """
    if max_norm <= 0:
        return 1.0
    return float(torch.clamp(max_norm / (torch.tensor(grad_norm, dtype=torch.float32) + 1e-6), max=1.0))


def step_torch_optimizer(optimizer: torch.optim.Optimizer, *, lr: float, grad_scale: float = 1.0) -> None:
    """``apply_gradients`` of a backend built on a ``torch.optim`` optimizer: multiply the
    gradients of its parameters by ``grad_scale`` (those that have one), set ``lr`` on every
    parameter group, then ``optimizer.step()``."""
    if grad_scale != 1.0:
        torch._foreach_mul_([q.grad for g in optimizer.param_groups for q in g["params"] if q.grad is not None],
                            grad_scale)
    for g in optimizer.param_groups:
        g["lr"] = lr
    optimizer.step()


def optimizer_step(backend: Any, batch: Any, loss_fn: Any, *, role: str, settings: OptimizerSettings) -> StepResult:
    """One optimizer step of ``role`` on ``batch`` (see the module docstring); every rank of
    the backend must call it (the backend's calls hold collectives).

    Args:
        backend: a :class:`~relax_core.contracts.TrainBackend` (or its Ray proxy).
        batch: the :class:`~relax_core.batch.Batch` of this step (this rank's share).
        loss_fn: ``(micro_batch, forward_output) -> (loss, metrics)``
            (:class:`~relax_core.stages.loss.ActorLoss`, :class:`~relax_core.stages.loss.CriticLoss`).
        role: ``actor`` or ``critic``.
        settings: :class:`OptimizerSettings`.

    Returns:
        :class:`~relax_core.contracts.StepResult`; its gradients are released either way.

    Raises:
        ValueError: an unknown role (from the backend or :meth:`OptimizerSettings.lr_at`).
    """
    try:
        grads = backend.accumulate_gradients(batch, loss_fn, role=role)
        norm = float(backend.grad_norm(role))
        bad = set(grads.nonfinite) | (set() if math.isfinite(norm) else {"grad_norm"})
        lr = settings.lr_at(role, backend.optimizer_steps(role))
        if not bad:
            backend.apply_gradients(role, lr=lr, grad_scale=clip_coefficient(norm, settings.clip_grad))
    finally:
        backend.zero_grad(role)
    return StepResult(sums=dict(grads.sums), grad_norm=norm, lr=lr, skipped=bool(bad),
                      micro_batches=grads.micro_batches, nonfinite=tuple(sorted(bad)))
