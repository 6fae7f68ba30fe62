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

import types
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from relax_core.batch import FIELDS, Batch
from relax_core.contracts import CorrectionInput, ForwardOutput, PolicyLossInput
from relax_core.numerics import kl_estimate, masked_fill_zero, reduce_loss, token_metric_mean


@dataclass(frozen=True)
class LossSettings:
    """The run's loss options (from :class:`~relax_core.config.RunConfig`)."""

    reduction: str
    norm_constant: float | None
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    entropy_coef: float
    behaviour_numerator: str | None
    compile_loss: bool = False

    @classmethod
    def from_config(cls, cfg: Any, behaviour_numerator: str | None) -> "LossSettings":
        return cls(
            reduction=cfg.effective_loss_reduction,
            norm_constant=cfg.loss_norm_constant or float(cfg.rollout_max_response_len),
            use_kl_loss=cfg.use_kl_loss,
            kl_loss_coef=cfg.kl_loss_coef,
            kl_loss_type=cfg.kl_loss_type,
            entropy_coef=cfg.entropy_coef,
            behaviour_numerator=behaviour_numerator,
            compile_loss=cfg.compile_loss,
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


def actor_loss_terms(estimator: Any, corrections: list[Any], s: LossSettings, process_group: Any, *,
                     num_tokens: Tensor, num_samples: Tensor, **fields: Tensor) -> tuple[Tensor, dict[str, Tensor], dict[str, Any]]:
    """The pure per-token part of the actor loss of one micro-batch: policy loss →
    corrections → the run's reduction (+ KL loss − entropy bonus) → token-metric means.
    Tensors in, tensors out, no host synchronisation, so that ``--compile-loss`` can fuse
    it with ``torch.compile``.

    Args:
        estimator, corrections, s, process_group: as :class:`ActorLoss`.
        num_tokens, num_samples: 0-dim float32 tensors, the global batch's denominators
            (tensors, not Python floats, so that a compiled graph does not specialise on
            their values and recompile at every step).
        fields: the micro-batch's tensor fields (:mod:`relax_core.batch`) with the
            backend's forward: ``log_probs`` ``[b, T]`` (requires grad), ``old_log_probs``,
            ``advantages``, ``loss_mask`` (bool), and where present ``entropy``,
            ``train_top_k_log_probs``, ``rollout_log_probs``, ``ref_log_probs`` and any
            other field; the estimator and every correction see them all as a read-only
            view (:class:`~relax_core.contracts.PolicyLossInput`,
            :class:`~relax_core.contracts.CorrectionInput`).

    Returns:
        ``(loss, metrics, scalar_metrics)``: the 0-dim loss (with grad); this micro-batch's
        0-dim detached contributions to the global-batch metrics (``pg_loss``,
        ``kl_loss``, ``entropy`` in the run's reduction — the entropy bonus's term —,
        ``loss``, and each token metric's masked mean over ``num_tokens``, among them
        ``entropy_token_mean``); the estimator's and corrections' scalar metrics as they
        return them.
    """
    mask = fields["loss_mask"]
    log_probs, entropy, rollout_log_probs = fields["log_probs"], fields.get("entropy"), fields.get("rollout_log_probs")
    pl = estimator.policy_loss(PolicyLossInput(**fields, process_group=process_group))
    per_token, token_metrics, scalar_metrics = pl.loss, dict(pl.token_metrics), dict(pl.scalar_metrics)
    is_weight = next((c.is_weight for c in corrections if callable(getattr(c, "is_weight", None))), None)
    for corr in corrections:
        co = corr.apply(CorrectionInput(**fields, loss=per_token, behaviour_numerator=s.behaviour_numerator,
                                        is_weight=is_weight, process_group=process_group))
        per_token = co.loss
        token_metrics.update(co.token_metrics)
        scalar_metrics.update(co.scalar_metrics)

    def reduce(x: Tensor) -> Tensor:
        return reduce_loss(x, mask, s.reduction, num_tokens=num_tokens, num_samples=num_samples,
                           norm_constant=s.norm_constant)

    pg_loss = reduce(per_token)
    loss = pg_loss
    metrics = {"pg_loss": pg_loss.detach()}
    if s.use_kl_loss:
        kl_loss = reduce(kl_estimate(log_probs, fields["ref_log_probs"], s.kl_loss_type, mask=mask))
        loss = loss + s.kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss.detach()
    if entropy is not None:
        ent = reduce(entropy)
        if s.entropy_coef > 0:
            loss = loss - s.entropy_coef * ent
        metrics["entropy"] = ent.detach()
    metrics["loss"] = loss.detach()
    if rollout_log_probs is not None and "train_rollout_logprob_abs_diff" not in token_metrics:  # tis/icepop give their own
        diff = masked_fill_zero(log_probs.detach().float() - rollout_log_probs.float(), mask)  # [b, T]
        token_metrics["train_rollout_logprob_abs_diff"] = diff.abs_()
    weights = mask.to(torch.float32)  # [b, T], once for every metric
    if entropy is not None:  # the token mean TRL and verl log, beside the run's reduction above
        token_metrics["entropy_token_mean"] = masked_fill_zero(entropy.detach(), mask)
    for name, x in token_metrics.items():
        metrics[name] = token_metric_mean(x, weights, num_tokens=num_tokens)
    return loss, metrics, scalar_metrics


class _FusedTerms:
    """:func:`actor_loss_terms` of one (estimator, corrections, settings, process group)
    through ``torch.compile(dynamic=True)``: the micro-batch shape ``[b, T]`` changes from
    step to step, and with dynamic shapes a new shape does not recompile.  Graph breaks in
    a plugin's code are fine (the pieces between them are compiled).  If compiling the
    forward or the backward fails (no working C++ compiler or Triton, an operation the
    compiler rejects; checked on the first call) it warns once and runs eager from then on.
    Dimensions of size 1 are specialised by dynamo: the first micro-batch with one sample
    or one token column compiles once more."""

    def __init__(self, eager: Callable[..., Any]) -> None:
        self.eager = eager
        self.compiled: Callable[..., Any] | None = torch.compile(eager, dynamic=True)
        self.checked = False

    def _check(self, tensors: dict[str, Any]) -> None:
        """Forward and backward once on detached copies: AOTAutograd compiles the backward
        lazily, and a failure there would otherwise surface in the backend's
        ``loss.backward()``, past any fallback."""
        copies = {k: v.detach().clone().requires_grad_(v.requires_grad) if isinstance(v, Tensor) else v
                  for k, v in tensors.items()}
        loss = self.compiled(**copies)[0]
        if loss.requires_grad:
            loss.backward()

    def __call__(self, **tensors: Any) -> Any:
        if self.compiled is not None:
            try:
                if not self.checked:
                    self._check(tensors)
                    self.checked = True
                return self.compiled(**tensors)
            except Exception as e:  # noqa: BLE001 - any compiler failure; eager re-raises a genuine error
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                warnings.warn(f"--compile-loss: torch.compile failed, the actor loss runs eager from now on "
                              f"({type(e).__name__}: {first})", RuntimeWarning, stacklevel=3)
                self.compiled = None
        return self.eager(**tensors)


#: The compiled loss functions, reused by every micro-batch and step of a run (the trainer
#: builds one ``ActorLoss`` per optimizer step).  Keyed by the components' identity; each
#: entry holds its components, so an ``id`` is not reused while its entry exists.
_FUSED: dict[tuple, tuple[tuple, _FusedTerms]] = {}
_FUSED_MAX = 8


def _terms_fn(estimator: Any, corrections: list[Any], s: LossSettings, process_group: Any) -> Callable[..., Any]:
    """:func:`actor_loss_terms` bound to the components: eager, or the cached compiled one."""
    def terms(**tensors: Any) -> Any:
        return actor_loss_terms(estimator, corrections, s, process_group, **tensors)

    if not s.compile_loss:
        return terms
    key = (id(estimator), tuple(id(c) for c in corrections), s, id(process_group))
    if key not in _FUSED:
        if len(_FUSED) >= _FUSED_MAX:
            _FUSED.pop(next(iter(_FUSED)))
        # dynamo keeps its compiled graphs per code object, at most recompile_limit (8) of
        # them: each component set gets its own code object, so that a process building
        # several (tests, benchmarks) does not fall back to eager after the eighth
        own = types.FunctionType(terms.__code__.replace(), terms.__globals__, terms.__name__, None, terms.__closure__)
        _FUSED[key] = ((estimator, tuple(corrections), process_group), _FusedTerms(own))
    return _FUSED[key][1]


class ActorLoss(_LossMetrics):
    """``loss_fn(micro_batch, forward_output) -> (loss, metrics)`` for the actor's
    optimizer step over one global batch (:func:`relax_core.stages.optimizer.optimizer_step`).

    Args:
        estimator: the estimator object (``policy_loss``).
        corrections: correction objects in application order (``apply``).
        settings: :class:`LossSettings`.  With ``compile_loss`` (``--compile-loss``) the
            per-token part (:func:`actor_loss_terms`) runs through ``torch.compile``,
            compiled at the run's first micro-batch and reused after (same values, one
            fused kernel instead of one pass over memory per operation).
        num_tokens / num_samples: the global batch's valid tokens and samples.
        old_from_current: use ``detach(log π_θ)`` as ``log π_old`` (exactly one update per
            rollout with the engine and the trainer on the same weights); else
            the micro-batch's ``old_log_probs``.
        process_group: the data-parallel group, given to the estimator as
            ``PolicyLossInput.process_group`` for statistics it reduces across ranks
            (``None`` = this process holds the whole batch).

    Every tensor field of the micro-batch reaches the estimator and the corrections
    (``advantages`` ``[b, T]``, ``old_log_probs``, ``rollout_log_probs``, ``ref_log_probs``
    for the KL loss, ``top_k_ids``/``top_k_log_probs``, a plugin's own fields…).

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
        self._terms = _terms_fn(estimator, corrections, settings, process_group)
        self._acc = _Accumulator()

    def __call__(self, mb: Batch, out: ForwardOutput) -> tuple[Tensor, dict[str, float]]:
        log_probs = out.log_probs  # [b, T], requires grad
        dev = log_probs.device
        fields = {k: v for k, v in mb.items().items() if FIELDS[k].per != "object"}
        fields.update(log_probs=log_probs, loss_mask=mb.loss_mask.bool())
        if self.old_from_current:
            fields["old_log_probs"] = log_probs.detach()
        for name, v in (("entropy", out.entropy), ("train_top_k_log_probs", out.top_k_log_probs)):
            if v is not None:
                fields[name] = v
        loss, metrics, scalar_metrics = self._terms(
            num_tokens=torch.tensor(float(self.num_tokens), device=dev),
            num_samples=torch.tensor(float(self.num_samples), device=dev), **fields)
        values = dict(zip(metrics, torch.stack([v.float() for v in metrics.values()]).tolist()))  # one sync
        for name, v in values.items():
            self._acc.add(name, v)
        share = mb.loss_mask.shape[0] / self.num_samples  # scalar metrics: sample-weighted mean
        for name, x in scalar_metrics.items():
            self._acc.add(name, (x.detach().float() if isinstance(x, Tensor) else float(x)) * share)
        return loss, {"loss": values["loss"]}


class CriticLoss(_LossMetrics):
    """``loss_fn`` for the critic's optimizer step: the estimator's ``value_loss`` reduced
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

    def __call__(self, mb: Batch, out: ForwardOutput) -> tuple[Tensor, dict[str, float]]:
        mask = mb.loss_mask.bool()
        vo = self.estimator.value_loss(self._input(
            values=out.values, old_values=mb.values, returns=mb.returns, loss_mask=mask))
        loss = reduce_loss(vo.loss, mask, self.s.reduction, num_tokens=self.num_tokens,
                           num_samples=self.num_samples, norm_constant=self.s.norm_constant)
        self._acc.add("value_loss", loss)
        for name, x in vo.token_metrics.items():
            self._acc.add(name, token_metric_mean(x, mask, num_tokens=self.num_tokens))
        return loss, {"value_loss": float(loss.detach())}
