"""The actor and critic losses of one optimizer step, composed from the plugins' pieces.

For a micro-batch of the global batch (per-token tensors ``[b, T]``)::

    pg      = estimator.policy_loss(log π_θ, log π_old, A)          per-token  [b, T]
    pg      = correction_k.apply(pg, …)   for each correction, in declared order
    loss    = reduce(pg)
            + kl_loss_coef · reduce(kl_estimate(log π_θ, log π_ref))  if --use-kl-loss
            − entropy_coef · reduce(H)                                if --entropy-coef > 0

``reduce`` is the run's reduction (:func:`relax_core.numerics.reduce_loss`) with the
*global* batch's denominators (valid tokens, samples), so the sum over micro-batches (and
data-parallel ranks) of each micro-batch's loss is the loss of the whole global batch, and
so is its gradient.  This is slime's ``loss_function`` composition (policy loss, then
TIS/ICE-POP, then reduction, entropy bonus and KL loss; see the specification's
"policy gradient to train/infer consistency" notes).

Metrics are accumulated here as *contributions* (each already divided by the global
denominator), so their sum over micro-batches is the global-batch value whatever the
backend does with the per-micro-batch dicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from relax_core.contracts import CorrectionInput, ForwardOutput, PolicyLossInput, TrainBatch
from relax_core.numerics import kl_estimate, reduce_loss, token_metric_mean


@dataclass(frozen=True)
class LossSettings:
    """The run's loss options (from :class:`~relax_core.config.RunConfig`)."""

    reduction: str
    norm_constant: float | None
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    entropy_coef: float
    policy_loss_kind: str

    @classmethod
    def from_config(cls, cfg: Any, policy_loss_kind: str) -> "LossSettings":
        return cls(
            reduction=cfg.effective_loss_reduction,
            norm_constant=cfg.loss_norm_constant or float(cfg.rollout_max_response_len),
            use_kl_loss=cfg.use_kl_loss,
            kl_loss_coef=cfg.kl_loss_coef,
            kl_loss_type=cfg.kl_loss_type,
            entropy_coef=cfg.entropy_coef,
            policy_loss_kind=policy_loss_kind,
        )


def global_denominators(loss_mask: Tensor) -> tuple[float, float]:
    """``(valid tokens, samples)`` of a global batch's ``loss_mask [B, T]``."""
    return float(loss_mask.sum()), float(loss_mask.shape[0])


class _Accumulator:
    """Sums metric contributions over micro-batches."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}

    def add(self, name: str, value: Any) -> None:
        v = float(value.detach()) if isinstance(value, Tensor) else float(value)
        self.sums[name] = self.sums.get(name, 0.0) + v

    def result(self, prefix: str) -> dict[str, float]:
        return {f"{prefix}{k}": v for k, v in self.sums.items()}


class _LossMetrics:
    """The metric sums of a loss over one global batch (``self._acc``)."""

    _acc: _Accumulator

    def metrics(self) -> dict[str, float]:
        """Global-batch metrics of the step (``train/`` prefix)."""
        return self._acc.result("train/")

    def add_metrics(self, contributions: dict[str, float]) -> None:
        """Add contributions to the same global-batch metrics computed elsewhere: another
        data-parallel rank's :meth:`metrics` of the same step (``train/`` names), so that
        :meth:`metrics` of a driver-side loss gives the whole batch's values."""
        for name, value in contributions.items():
            self._acc.add(name.removeprefix("train/"), value)


class ActorLoss(_LossMetrics):
    """``loss_fn(micro_batch, forward_output) -> (loss, metrics)`` for the actor's
    ``train_step`` over one global batch.

    Args:
        estimator: the estimator object (``policy_loss``).
        corrections: correction objects in application order (``apply``).
        settings: :class:`LossSettings`.
        num_tokens / num_samples: the global batch's valid tokens and samples.
        old_from_current: use ``detach(log π_θ)`` as ``log π_old`` (exactly one update per
            rollout with the engine and the trainer on the same weights); else
            ``micro_batch.tensors['old_log_probs']``.
        process_group: the data-parallel group, given to the estimator as
            ``PolicyLossInput.process_group`` for statistics it reduces across ranks
            (``None`` = this process holds the whole batch).

    Micro-batch tensors used: ``advantages`` ``[b, T]``, ``old_log_probs``,
    ``rollout_log_probs``, ``ref_log_probs`` (KL loss), ``top_k_ids``/``top_k_log_probs``.

    After the step, :meth:`metrics` gives ``train/loss``, ``train/pg_loss``,
    ``train/kl_loss``, ``train/entropy`` and every token/scalar metric of the estimator and
    corrections (``train/pg_clipfrac``, ``train/ppo_kl``, …), each over the global batch.
    """

    def __init__(self, estimator: Any, corrections: list[Any], settings: LossSettings, *,
                 num_tokens: float, num_samples: float, old_from_current: bool, process_group: Any = None) -> None:
        self.estimator = estimator
        self.corrections = corrections
        self.s = settings
        self.num_tokens = num_tokens
        self.num_samples = num_samples
        self.old_from_current = old_from_current
        self.process_group = process_group
        self.needs_entropy = True  # train/entropy is always reported
        self.needs_top_k = any(getattr(c, "needs_top_k", False) for c in corrections)
        self.is_weight = next((c.is_weight for c in corrections if callable(getattr(c, "is_weight", None))), None)
        self._acc = _Accumulator()
        self._scalar_weight = 0.0

    def _reduce(self, x: Tensor, mask: Tensor) -> Tensor:
        return reduce_loss(x, mask, self.s.reduction, num_tokens=self.num_tokens,
                           num_samples=self.num_samples, norm_constant=self.s.norm_constant)

    def __call__(self, mb: TrainBatch, out: ForwardOutput) -> tuple[Tensor, dict[str, float]]:
        t = mb.tensors
        mask = mb.loss_mask.bool()  # [b, T]
        log_probs = out.log_probs  # [b, T], requires grad
        old = log_probs.detach() if self.old_from_current else t["old_log_probs"]
        rollout_lp = t.get("rollout_log_probs")
        pl = self.estimator.policy_loss(PolicyLossInput(
            log_probs=log_probs, old_log_probs=old, advantages=t["advantages"], loss_mask=mask,
            rollout_log_probs=rollout_lp, process_group=self.process_group))
        per_token, token_metrics, scalar_metrics = pl.loss, dict(pl.token_metrics), dict(pl.scalar_metrics)
        for corr in self.corrections:
            co = corr.apply(CorrectionInput(
                loss=per_token, log_probs=log_probs, old_log_probs=old, advantages=t["advantages"],
                loss_mask=mask, policy_loss_kind=self.s.policy_loss_kind, rollout_log_probs=rollout_lp,
                top_k_ids=t.get("top_k_ids"), top_k_log_probs=t.get("top_k_log_probs"),
                train_top_k_log_probs=out.top_k_log_probs, is_weight=self.is_weight,
                response_ids=mb.response_ids))
            per_token = co.loss
            token_metrics.update(co.token_metrics)
            scalar_metrics.update(co.scalar_metrics)

        pg_loss = self._reduce(per_token, mask)
        loss = pg_loss
        acc = self._acc
        acc.add("pg_loss", pg_loss)
        if self.s.use_kl_loss:
            kl = kl_estimate(log_probs, t["ref_log_probs"], self.s.kl_loss_type, mask=mask)  # [b, T]
            kl_loss = self._reduce(kl, mask)
            loss = loss + self.s.kl_loss_coef * kl_loss
            acc.add("kl_loss", kl_loss)
        if out.entropy is not None:
            ent = self._reduce(out.entropy, mask)
            if self.s.entropy_coef > 0:
                loss = loss - self.s.entropy_coef * ent
            acc.add("entropy", ent)
        acc.add("loss", loss)
        for name, x in token_metrics.items():
            acc.add(name, token_metric_mean(x, mask, num_tokens=self.num_tokens))
        if rollout_lp is not None and "train_rollout_logprob_abs_diff" not in token_metrics:  # tis/icepop give their own
            diff = (log_probs.detach() - rollout_lp).abs()
            acc.add("train_rollout_logprob_abs_diff", token_metric_mean(diff, mask, num_tokens=self.num_tokens))
        share = mask.shape[0] / self.num_samples  # scalar metrics: sample-weighted mean
        for name, x in scalar_metrics.items():
            acc.add(name, (x.detach().float() if isinstance(x, Tensor) else float(x)) * share)
        return loss, {"loss": float(loss.detach())}


class CriticLoss(_LossMetrics):
    """``loss_fn`` for the critic's ``train_step``: the estimator's ``value_loss`` reduced
    with the run's reduction and global denominators (PPO value clipping lives in the
    estimator).  Micro-batch tensors: ``values`` (old, ``[b, T]``), ``returns``."""

    def __init__(self, estimator: Any, settings: LossSettings, *, num_tokens: float, num_samples: float) -> None:
        from relax_core.contracts import ValueLossInput

        self._input = ValueLossInput
        self.estimator = estimator
        self.s = settings
        self.num_tokens = num_tokens
        self.num_samples = num_samples
        self.needs_entropy = False
        self.needs_top_k = False
        self._acc = _Accumulator()

    def __call__(self, mb: TrainBatch, out: ForwardOutput) -> tuple[Tensor, dict[str, float]]:
        mask = mb.loss_mask.bool()
        vo = self.estimator.value_loss(self._input(
            values=out.values, old_values=mb.tensors["values"], returns=mb.tensors["returns"], loss_mask=mask))
        loss = reduce_loss(vo.loss, mask, self.s.reduction, num_tokens=self.num_tokens,
                           num_samples=self.num_samples, norm_constant=self.s.norm_constant)
        self._acc.add("value_loss", loss)
        for name, x in vo.token_metrics.items():
            self._acc.add(name, token_metric_mean(x, mask, num_tokens=self.num_tokens))
        return loss, {"value_loss": float(loss.detach())}
