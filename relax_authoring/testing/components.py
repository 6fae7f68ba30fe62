"""Behavioural contract checks of estimators, corrections and reward components.

Shapes: ``B`` samples (3 groups × ``n``), ``T`` = 8 padded response positions.  Every
token input carries garbage at masked positions in the "garbage" variant (NaN, 1e9 and
−1e9 in turn) and 0 in the "clean" one; both must give the same values at valid
positions and the same gradients.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from relax_authoring.testing.contract import Checks, capability_problems, require
from relax_core.contracts import (
    AdvantageInput,
    AdvantageOutput,
    CorrectionInput,
    CorrectionOutput,
    PolicyLossInput,
    PolicyLossOutput,
    RewardBatch,
    ValueLossInput,
)
from relax_core.numerics import reduce_loss
from relax_core.specs import BEHAVIOUR_NUMERATORS

T = 8
GROUPS = 3
#: absolute and relative tolerance of "same value / same gradient" comparisons
TOL = 1e-6
CP_CUT = 3  # rank 0 holds positions [0, 3), rank 1 [3, T): short responses live on rank 0 only


# --------------------------------------------------------------------------- the batch


@dataclass(frozen=True)
class SyntheticBatch:
    """A small batch with the awkward cases (shapes as in :mod:`relax_core.contracts`)."""

    rewards: Tensor  # float32 [B]; NaN = unscored
    group_index: Tensor  # long [B], non-contiguous values, shuffled positions
    loss_mask: Tensor  # bool [B, T]
    response_lengths: Tensor  # long [B]; one 0 (empty response), one T
    old_log_probs: Tensor  # [B, T]
    log_probs: Tensor  # [B, T] current policy: old + noise (some ratios clip)
    rollout_log_probs: Tensor  # [B, T]
    ref_log_probs: Tensor  # [B, T]
    values: Tensor  # [B, T] critic values
    reward_parts: Tensor  # float32 [B, 2]: two scorers' rewards summing to ``rewards`` (NaN where unscored)

    def token_fields(self) -> list[str]:
        return ["old_log_probs", "log_probs", "rollout_log_probs", "ref_log_probs", "values"]

    def variant(self, garbage: bool, dtype: torch.dtype = torch.float32) -> "SyntheticBatch":
        """Token fields with 0 (clean) or NaN/±1e9 (garbage) at masked positions."""
        return dataclasses.replace(self, **{f: fill_masked(getattr(self, f), self.loss_mask, garbage).to(dtype)
                                            for f in self.token_fields()})


def fill_masked(x: Tensor, mask: Tensor, garbage: bool) -> Tensor:
    """``x`` at valid positions; at masked ones 0, or NaN / 1e9 / −1e9 in turn."""
    if not garbage:
        return torch.where(mask, x, torch.zeros((), dtype=x.dtype))
    pos = torch.arange(x.numel()).reshape(x.shape) % 3
    junk = torch.where(pos == 0, float("nan"), torch.where(pos == 1, 1e9, -1e9)).to(x.dtype)
    return torch.where(mask, x, junk)


def synthetic_batch(n: int, *, seed: int = 0) -> SyntheticBatch:
    """3 groups of ``n`` samples: one with mixed 0/1 rewards (and an empty response), one
    all-equal, one with continuous rewards and an unscored (NaN) sample."""
    g = torch.Generator().manual_seed(seed)
    b = GROUPS * n
    gid = torch.arange(GROUPS).repeat_interleave(n)
    mixed = (torch.arange(n) % 2 == 0).float()
    cont = torch.randn(n, generator=g)
    cont[-1] = float("nan")
    rewards = torch.cat([mixed, torch.ones(n), cont])
    lengths = torch.randint(1, T + 1, (b,), generator=g)
    lengths[1], lengths[n] = 0, T  # an empty response; a full-length one
    perm = torch.randperm(b, generator=g)
    rewards, gid, lengths = rewards[perm], torch.tensor([7, 2, 11])[gid][perm], lengths[perm]
    mask = torch.arange(T)[None, :] < lengths[:, None]
    old = -(torch.rand(b, T, generator=g) * 2.5 + 0.1)
    second = torch.where(torch.isfinite(rewards), (torch.arange(b) % 3 == 0).float(), float("nan"))
    return SyntheticBatch(
        rewards=rewards, group_index=gid, loss_mask=mask, response_lengths=lengths,
        reward_parts=torch.stack([rewards - second, second], dim=1),
        old_log_probs=old, log_probs=old + 0.3 * torch.randn(b, T, generator=g),
        rollout_log_probs=old + 0.05 * torch.randn(b, T, generator=g),
        ref_log_probs=old + 0.1 * torch.randn(b, T, generator=g), values=torch.randn(b, T, generator=g))


#: holes of :func:`with_holes`: (compact position, hole length): environment tokens inserted
#: before compact positions 2 and 5 of every response long enough to have them
HOLES = ((2, 2), (5, 3))


def with_holes(b: SyntheticBatch) -> tuple[SyntheticBatch, Tensor]:
    """``b`` as multi-turn episodes: the same model tokens with environment tokens (holes in
    ``loss_mask``, garbage in every token field) inserted between them, at :data:`HOLES`.

    Returns:
        ``(holed, dest)``: the holed batch (``T`` + 5 positions; ``response_lengths`` count the
        holes, as an episode's do) and long ``[T]`` ``dest``, the holed position of each
        compact one, so that ``holed.x[:, dest] == b.x`` at the model tokens.
    """
    j = torch.arange(T)
    dest = j + sum(n * (j >= at) for at, n in HOLES)  # [T]
    width = T + sum(n for _, n in HOLES)
    mask = torch.zeros(b.loss_mask.shape[0], width, dtype=torch.bool)
    mask[:, dest] = b.loss_mask

    def spread(x: Tensor) -> Tensor:
        out = fill_masked(torch.zeros(x.shape[0], width, dtype=x.dtype), mask, True)
        out[:, dest] = torch.where(b.loss_mask, x, out[:, dest])
        return out

    lengths = torch.where(b.response_lengths > 0, dest[(b.response_lengths - 1).clamp(min=0)] + 1, 0)
    return dataclasses.replace(b, loss_mask=mask, response_lengths=lengths,
                               **{f: spread(getattr(b, f)) for f in b.token_fields()}), dest


# --------------------------------------------------------------------------- assertions


def _tensor(x: Any, name: str, shape: tuple, dtype: torch.dtype | None = None) -> Tensor:
    require(isinstance(x, torch.Tensor), f"{name} must be a tensor, got {type(x).__name__}")
    require(tuple(x.shape) == shape, f"{name} has shape {tuple(x.shape)}, expected {shape}")
    if dtype is not None:
        require(x.dtype == dtype, f"{name} has dtype {x.dtype}, expected {dtype}")
    return x


def _finite_at(x: Tensor, mask: Tensor, name: str) -> None:
    bad = ~torch.isfinite(x.detach()) & mask
    require(not bad.any(), f"{name} is not finite at {int(bad.sum())} valid position(s)")


def _scalar_metrics(metrics: Any, name: str) -> None:
    require(isinstance(metrics, dict), f"{name} must be a dict")
    for k, v in metrics.items():
        require(isinstance(k, str) and k, f"{name}: bad metric name {k!r}")
        if isinstance(v, torch.Tensor):
            require(v.numel() == 1, f"{name}[{k!r}] must be a scalar, got shape {tuple(v.shape)}")
            v = float(v.detach())
        require(isinstance(v, (int, float)) and not isinstance(v, bool), f"{name}[{k!r}] must be a number, got {type(v).__name__}")
        require(math.isfinite(v), f"{name}[{k!r}] = {v} is not finite")


def _token_metrics(metrics: Any, mask: Tensor, name: str) -> None:
    require(isinstance(metrics, dict), f"{name} must be a dict")
    for k, v in metrics.items():
        _tensor(v, f"{name}[{k!r}]", tuple(mask.shape))
        _finite_at(v, mask, f"{name}[{k!r}]")
        bad = int((~torch.isfinite(v.detach()) & ~mask).sum())  # the core reduces them as Σ mask·x, no select
        require(not bad, f"{name}[{k!r}] is not finite at {bad} masked position(s) (give 0 there)")


def _same(a: Tensor | None, b: Tensor | None, mask: Tensor | None, what: str) -> None:
    require(a is not None and b is not None, f"{what}: missing in one of the two runs")
    if mask is not None:
        a, b = torch.where(mask, a, 0), torch.where(mask, b, 0)
    diff = (a.double() - b.double()).abs()
    limit = TOL + TOL * b.double().abs()
    bad = ~(diff <= limit)
    require(not bad.any(), f"{what} differs at {int(bad.sum())} position(s) (max |diff| "
                           f"{float(diff.nan_to_num(float('inf')).max()):.3g})")


def _grad_ok(grad: Tensor | None, mask: Tensor, what: str) -> None:
    require(grad is not None, f"no gradient reaches {what}")
    require(torch.isfinite(grad).all(), f"gradient w.r.t. {what} is not finite everywhere")
    require(not (grad != 0)[~mask].any(), f"gradient w.r.t. {what} is non-zero at masked positions")
    require((grad != 0)[mask].any(), f"gradient w.r.t. {what} is zero at every valid position")


def _reduction(cfg: Any) -> tuple[str, float]:
    return cfg.effective_loss_reduction, float(cfg.loss_norm_constant or cfg.rollout_max_response_len)


# --------------------------------------------------------------------------- estimators


def _advantage_input(b: SyntheticBatch) -> AdvantageInput:
    return AdvantageInput(rewards=b.rewards, group_index=b.group_index, loss_mask=b.loss_mask,
                          reward_parts=b.reward_parts,
                          old_log_probs=b.old_log_probs, ref_log_probs=b.ref_log_probs, values=b.values,
                          response_lengths=b.response_lengths)


def policy_loss_value_and_grad(est: Any, b: SyntheticBatch, advantages: Tensor, cfg: Any, *,
                               process_group: Any = None, num_tokens: Any = None, num_samples: Any = None,
                               tokens_per_sample: Tensor | None = None) -> tuple[PolicyLossOutput, Tensor, Tensor]:
    """Run ``policy_loss`` and reduce it as the core does; returns (output, loss, grad)."""
    mode, norm = _reduction(cfg)
    log_probs = b.log_probs.clone().requires_grad_(True)
    out = est.policy_loss(PolicyLossInput(log_probs=log_probs, old_log_probs=b.old_log_probs, advantages=advantages,
                                          loss_mask=b.loss_mask, rollout_log_probs=b.rollout_log_probs,
                                          process_group=process_group))
    require(isinstance(out, PolicyLossOutput), f"returned {type(out).__name__}, expected PolicyLossOutput")
    _tensor(out.loss, "loss", tuple(b.loss_mask.shape))
    loss = reduce_loss(out.loss, b.loss_mask, mode, num_tokens=num_tokens, num_samples=num_samples,
                       tokens_per_sample=tokens_per_sample, norm_constant=norm)
    loss.backward()
    return out, loss.detach(), log_probs.grad


def check_estimator(spec: Any, params: Any, caps: Any, cfg: Any, checks: Checks, *, distributed: bool) -> None:
    with checks.check("validator accepts a config meeting the declared requirements"):
        bad = capability_problems("estimator", spec.name, caps, cfg)
        require(not bad, "; ".join(f"[{c}] {m}" for c, m in bad))
    with checks.check("sync_only / supports_fully_async in async mode"):
        async_cfg = dataclasses.replace(cfg, fully_async=True, launcher="ray", max_staleness=1)
        refused = dict(capability_problems("estimator", spec.name, caps, async_cfg))
        if caps.sync_only:
            require("sync_only" in refused, "a sync_only estimator is not refused with --fully-async --max-staleness 1")
        if caps.supports_fully_async:
            require(not {"sync_only", "supports_fully_async"} & set(refused), f"declares supports_fully_async but is refused in async mode: {refused}")
    est = None
    with checks.check("build"):
        est = spec.build(params, cfg)
        for method in ("compute_advantages", "policy_loss") + (("value_loss",) if caps.needs_critic else ()):
            require(callable(getattr(est, method, None)), f"the built object has no {method}()")
    if est is None:
        return
    batch = synthetic_batch(cfg.n_samples_per_prompt)
    shape, mask = tuple(batch.loss_mask.shape), batch.loss_mask
    adv = None
    with checks.check("compute_advantages"):
        clean = est.compute_advantages(_advantage_input(batch.variant(False)))
        dirty = est.compute_advantages(_advantage_input(batch.variant(True)))
        for out in (clean, dirty):
            require(isinstance(out, AdvantageOutput), f"returned {type(out).__name__}, expected AdvantageOutput")
            _tensor(out.advantages, "advantages", shape, torch.float32)
            _tensor(out.returns, "returns", shape)
            _finite_at(out.advantages, mask, "advantages")
            _finite_at(out.returns, mask, "returns")
            require(not (out.advantages.detach() != 0)[~mask].any(), "advantages are not 0 at masked positions")
            _scalar_metrics(out.metrics, "metrics")
        _same(dirty.advantages, clean.advantages, mask, "advantages with NaN/1e9 in masked inputs")
        _same(dirty.returns, clean.returns, mask, "returns with NaN/1e9 in masked inputs")
        adv = clean.advantages.detach()
    if adv is None:
        return
    with checks.check("policy_loss"):
        results = []
        for garbage in (False, True):
            b = batch.variant(garbage)
            out, loss, grad = policy_loss_value_and_grad(est, b, fill_masked(adv, mask, garbage), cfg)
            _finite_at(out.loss, mask, "loss")
            _token_metrics(out.token_metrics, mask, "token_metrics")
            _scalar_metrics(out.scalar_metrics, "scalar_metrics")
            require(torch.isfinite(loss), f"reduced loss {float(loss)} is not finite")
            _grad_ok(grad, mask, "log_probs")
            results.append((loss, grad))
        (l0, g0), (l1, g1) = results
        _same(l1, l0, None, "reduced loss with NaN/1e9 in masked inputs")
        _same(g1, g0, None, "gradient w.r.t. log_probs with NaN/1e9 in masked inputs")
    with checks.check("policy_loss with bfloat16 inputs"):
        b = batch.variant(True, torch.bfloat16)
        out, loss, grad = policy_loss_value_and_grad(est, b, fill_masked(adv, mask, True).to(torch.bfloat16), cfg)
        _finite_at(out.loss, mask, "loss")
        require(torch.isfinite(loss), f"reduced loss {float(loss)} is not finite")
        _grad_ok(grad, mask, "log_probs")
        require(grad.dtype == torch.bfloat16, f"gradient w.r.t. bfloat16 log_probs has dtype {grad.dtype}")
    if caps.supports_loss_mask_holes:
        with checks.check("supports_loss_mask_holes: environment tokens inside responses change nothing"):
            _check_holes(est, batch, adv, cfg)
    if caps.accepts_advantage_terms:
        with checks.check("accepts_advantage_terms: a per-token advantage term is credit at its own token"):
            _check_advantage_terms(est, batch, adv, cfg)
    if caps.needs_critic:
        with checks.check("value_loss"):
            mode, norm = _reduction(cfg)
            results = []
            for garbage in (False, True):
                b = batch.variant(garbage)
                values = b.values.clone().requires_grad_(True)
                out = est.value_loss(ValueLossInput(
                    values=values, old_values=fill_masked(batch.values.roll(1, dims=1), mask, garbage),
                    returns=fill_masked(clean.returns.detach(), mask, garbage), loss_mask=mask))
                require(isinstance(out, PolicyLossOutput), f"returned {type(out).__name__}, expected PolicyLossOutput")
                _tensor(out.loss, "value loss", shape)
                _finite_at(out.loss, mask, "value loss")
                _token_metrics(out.token_metrics, mask, "value token_metrics")
                loss = reduce_loss(out.loss, mask, mode, norm_constant=norm)
                loss.backward()
                _grad_ok(values.grad, mask, "values")
                results.append((loss.detach(), values.grad))
            _same(results[1][0], results[0][0], None, "value loss with NaN/1e9 in masked inputs")
            _same(results[1][1], results[0][1], None, "gradient w.r.t. values with NaN/1e9 in masked inputs")
    if caps.supports_context_parallel and distributed:
        with checks.check("supports_context_parallel: same loss and gradient over 2 ranks"):
            _check_context_parallel(spec, params, cfg, batch, adv)


def _check_holes(est: Any, batch: SyntheticBatch, adv: Tensor, cfg: Any) -> None:
    """The same responses with holes (:func:`with_holes`, garbage in them) give the same
    advantages and returns at the model tokens, 0 in the holes, and the same reduced loss and
    gradient: the estimator counts tokens with ``loss_mask``, not positions or lengths."""
    holed, dest = with_holes(batch.variant(False))
    mask = holed.loss_mask
    out = est.compute_advantages(_advantage_input(holed))
    _finite_at(out.advantages, mask, "advantages with holes")
    require(not (out.advantages.detach() != 0)[~mask].any(), "advantages are not 0 in the holes")
    _same(out.advantages[:, dest], adv, batch.loss_mask, "advantages at the model tokens, with holes")
    clean = est.compute_advantages(_advantage_input(batch.variant(False)))
    _same(out.returns[:, dest], clean.returns, batch.loss_mask, "returns at the model tokens, with holes")
    a = fill_masked(torch.zeros_like(holed.log_probs), mask, True)
    a[:, dest] = torch.where(batch.loss_mask, adv, a[:, dest])
    _, l_holed, g_holed = policy_loss_value_and_grad(est, holed, a, cfg)
    _, l_compact, g_compact = policy_loss_value_and_grad(est, batch.variant(False), adv, cfg)
    _same(l_holed, l_compact, None, "reduced loss with holes")
    _grad_ok(g_holed, mask, "log_probs with holes")
    _same(g_holed[:, dest], g_compact, None, "gradient w.r.t. log_probs at the model tokens, with holes")


def _check_advantage_terms(est: Any, batch: SyntheticBatch, adv: Tensor, cfg: Any) -> None:
    """A term added to the advantage of one token per response (the first valid one, as a
    correction's ``advantage_term`` would) changes the gradient w.r.t. ``log_probs`` at those
    tokens and nowhere else: the policy loss treats each token's advantage on its own."""
    b = batch.variant(False)
    mask = b.loss_mask
    touched = mask & (mask.cumsum(1) == 1)
    _, _, g0 = policy_loss_value_and_grad(est, b, adv, cfg)
    _, _, g1 = policy_loss_value_and_grad(est, b, adv + torch.where(touched, 0.5, 0.0), cfg)
    _same(g1, g0, mask & ~touched, "gradient w.r.t. log_probs away from the tokens whose advantage the term changed")
    require((g1 - g0)[touched].abs().max() > 1e-6, "a per-token advantage term changes the gradient at no token")


# --------------------------------------------------------------------------- context parallel


def _check_context_parallel(spec: Any, params: Any, cfg: Any, batch: SyntheticBatch, adv: Tensor) -> None:
    from relax_authoring.testing.distributed import run_on_two_ranks
    from relax_core.specs import resolve

    cfg = dataclasses.replace(cfg, context_parallel_size=2)
    b = batch.variant(True, torch.float64)
    adv = fill_masked(adv.to(torch.float64), b.loss_mask, True)
    est = resolve(spec.factory)(params, cfg)
    _, full_loss, full_grad = policy_loss_value_and_grad(est, b, adv, cfg)
    ranks = run_on_two_ranks("relax_authoring.testing.components:_cp_rank", spec.factory, params, cfg, b, adv)
    loss = sum(r[0] for r in ranks)
    grad = torch.cat([r[1] for r in ranks], dim=1)
    _same(loss, full_loss, None, f"loss summed over 2 ranks ({float(loss):.9g} vs one process {float(full_loss):.9g})")
    _same(grad, full_grad, None, "gradient w.r.t. log_probs gathered from 2 ranks")


def _cp_rank(rank: int, group: Any, factory: str, params: Any, cfg: Any, b: SyntheticBatch,
             adv: Tensor) -> tuple[Tensor, Tensor]:
    """One context-parallel rank: positions ``[0, CP_CUT)`` or ``[CP_CUT, T)`` of every
    sequence, global denominators, the rank group as ``process_group``."""
    from relax_core.specs import resolve

    cols = slice(0, CP_CUT) if rank == 0 else slice(CP_CUT, T)
    mask = b.loss_mask
    piece = dataclasses.replace(b, loss_mask=mask[:, cols], **{f: getattr(b, f)[:, cols] for f in b.token_fields()})
    est = resolve(factory)(params, cfg)
    _, loss, grad = policy_loss_value_and_grad(est, piece, adv[:, cols], cfg, process_group=group,
                                               num_tokens=mask.sum(), num_samples=mask.shape[0],
                                               tokens_per_sample=mask.sum(-1))
    return loss, grad


# --------------------------------------------------------------------------- corrections


def _numerator(caps: Any) -> str | None:
    """The behaviour numerator the kit runs the correction with: ``old_log_probs`` when it
    accepts it, else the first it accepts."""
    accepted = caps.behaviour_numerators
    if "*" in accepted or "old_log_probs" in accepted:
        return "old_log_probs"
    return sorted(accepted)[0] if accepted else None


def _check_advantage_term(corr: Any, checks: Checks) -> None:
    """A correction that declares ``advantage_term``: on the whole synthetic batch (with
    ``teacher_log_probs`` beside the log-probs), a finite float32 ``[B, T]`` term, 0 at masked
    positions, unchanged by NaN/±1e9 there, detached, and finite scalar metrics."""
    from relax_core.contracts import AdvantageInput, AdvantageTerm

    batch = synthetic_batch(4)
    mask, shape = batch.loss_mask, tuple(batch.loss_mask.shape)
    teacher = batch.old_log_probs + 0.2 * torch.randn(shape, generator=torch.Generator().manual_seed(3))

    def run(garbage: bool) -> Any:
        b = batch.variant(garbage)
        out = corr.advantage_term(AdvantageInput(
            rewards=b.rewards, group_index=b.group_index, loss_mask=mask, response_lengths=b.response_lengths,
            old_log_probs=b.old_log_probs, rollout_log_probs=b.rollout_log_probs, ref_log_probs=b.ref_log_probs,
            teacher_log_probs=fill_masked(teacher, mask, garbage)))
        require(isinstance(out, AdvantageTerm), f"returned {type(out).__name__}, expected AdvantageTerm")
        _tensor(out.term, "term", shape, torch.float32)
        require(not out.term.requires_grad, "the advantage term requires grad (detach it)")
        _finite_at(out.term, mask, "term")
        require(not (out.term[~mask] != 0).any(), "the advantage term is not 0 at masked positions")
        require(isinstance(out.metrics, dict) and all(isinstance(v, float) and math.isfinite(v)
                                                      for v in out.metrics.values()),
                "metrics must be a dict of finite python floats")
        return out

    with checks.check("advantage_term"):
        clean, dirty = run(False), run(True)
        _same(dirty.term, clean.term, None, "advantage term with NaN/1e9 in masked inputs")


def check_correction(spec: Any, params: Any, caps: Any, cfg: Any, checks: Checks) -> None:
    kind = _numerator(caps)
    with checks.check("behaviour_numerators"):
        require(kind is None or kind in BEHAVIOUR_NUMERATORS,
                f"behaviour_numerators {sorted(caps.behaviour_numerators)} names values outside {list(BEHAVIOUR_NUMERATORS)}")
        require(kind is not None, "accepts no behaviour numerator: it could never be selected")
    corr = None
    method = "advantage_term" if caps.advantage_term else "apply"
    with checks.check("build"):
        corr = spec.build(params, cfg)
        require(callable(getattr(corr, method, None)), f"the built object has no {method}()")
    if corr is not None and caps.advantage_term:
        _check_advantage_term(corr, checks)
        return
    if corr is None or kind is None:
        return
    batch = synthetic_batch(4)
    mask, shape, k = batch.loss_mask, tuple(batch.loss_mask.shape), 4  # [B, T], k = top-k width
    g = torch.Generator().manual_seed(1)
    head = torch.log_softmax(torch.randn(*shape, k + 1, generator=g), -1)[..., :k]  # a top-k head, mass < 1
    train_head = torch.log_softmax(torch.randn(*shape, k + 1, generator=g), -1)[..., :k]
    ids = torch.rand(*shape, 100, generator=g).argsort(-1)[..., :k]  # distinct ids per position
    adv = torch.randn(shape[0], generator=g)[:, None].expand(shape)

    mask_k = mask[..., None].expand(*shape, k)
    top = "top_k_log_probs" in caps.requires_fields

    def run(garbage: bool, independent_loss: bool = False, pieces: tuple[slice, ...] = (slice(0, T),),
            ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Apply to each column piece of the sequences (one piece = the whole batch; two =
        context-parallel halves), reduce each with the global token count, and return the
        summed loss and the gradients w.r.t. the full log_probs / train top-k leaves."""
        b = batch.variant(garbage)
        log_probs = b.log_probs.clone().requires_grad_(True)
        train_top_k = (fill_masked(train_head, mask_k, True) if garbage else train_head).requires_grad_(True)
        a = fill_masked(adv, mask, garbage)
        if independent_loss:  # a loss tensor with no autograd path to log_probs
            loss_in = fill_masked(torch.randn(shape, generator=torch.Generator().manual_seed(2)), mask, garbage)
            loss_in.requires_grad_(True)
        else:  # the REINFORCE-style surrogate −r·A of the estimator stage, garbage where masked
            log_ratio = torch.where(mask, log_probs - b.old_log_probs, 0.0)
            loss_in = torch.where(mask, -torch.exp(log_ratio) * torch.where(mask, a, 0.0), fill_masked(a, mask, garbage))
        head_in = fill_masked(head, mask_k, True) if garbage else head
        total = torch.zeros((), dtype=torch.float32)
        for c in pieces:
            m = mask[:, c]
            out = corr.apply(CorrectionInput(
                loss=loss_in[:, c], log_probs=log_probs[:, c], old_log_probs=b.old_log_probs[:, c], advantages=a[:, c],
                loss_mask=m, behaviour_numerator=kind, rollout_log_probs=b.rollout_log_probs[:, c],
                top_k_ids=ids[:, c] if top else None, top_k_log_probs=head_in[:, c] if top else None,
                train_top_k_log_probs=train_top_k[:, c] if top else None))
            require(isinstance(out, CorrectionOutput), f"returned {type(out).__name__}, expected CorrectionOutput")
            _tensor(out.loss, "loss", tuple(m.shape))
            _finite_at(out.loss, m, "loss")
            _token_metrics(out.token_metrics, m, "token_metrics")
            _scalar_metrics(out.scalar_metrics, "scalar_metrics")
            total = total + reduce_loss(out.loss, m, "token-mean", num_tokens=mask.sum())
        if not total.requires_grad:
            return total.detach(), None, None
        grads = torch.autograd.grad(total, [log_probs, train_top_k], allow_unused=True)
        return total.detach(), grads[0], grads[1]

    with checks.check("apply"):
        (l0, g0, h0), (l1, g1, h1) = run(False), run(True)
        require(torch.isfinite(l0), "reduced corrected loss is not finite")
        _grad_ok(g0, mask, "log_probs")
        _same(l1, l0, None, "corrected loss with NaN/1e9 in masked inputs")
        _same(g1, g0, None, "gradient w.r.t. log_probs with NaN/1e9 in masked inputs")
        if h0 is not None or h1 is not None:
            require(h0 is not None and h1 is not None and torch.isfinite(h1).all(),
                    "gradient w.r.t. the trainer's top-k log-probs is missing or not finite")
            _same(h1, h0, None, "gradient w.r.t. train_top_k_log_probs with NaN/1e9 in masked inputs")
    if not top:
        with checks.check("importance weights carry no gradient"):
            g = run(True, independent_loss=True)[1]
            require(g is None or not (g != 0).any(),
                    "the corrected loss has a gradient w.r.t. log_probs through the correction (detach the weight)")
    if caps.supports_context_parallel:
        with checks.check("supports_context_parallel: same loss and gradient over 2 sequence pieces"):
            (l_full, g_full, h_full), (l_cp, g_cp, h_cp) = run(True), run(True, pieces=(slice(0, CP_CUT), slice(CP_CUT, T)))
            _same(l_cp, l_full, None, "corrected loss summed over the 2 pieces of each sequence")
            _same(g_cp, g_full, None, "gradient w.r.t. log_probs over the 2 pieces of each sequence")
            if h_full is not None:
                _same(h_cp, h_full, None, "gradient w.r.t. train_top_k_log_probs over the 2 pieces")


# --------------------------------------------------------------------------- rewards

_SCORER_CASES = (
    ("The answer is 42.", "42", {}),
    ("", "1", {}),
    ("\\boxed{3}", "3", {}),
    ("x" * 4000, "7", {"note": "long response"}),
)


def check_reward_scorer(spec: Any, params: Any, cfg: Any, checks: Checks) -> None:
    fn = None
    with checks.check("build"):
        fn = spec.build(params, cfg)
        require(callable(fn), "the factory must return fn(response, label, metadata) -> float | None")
    if fn is None:
        return
    if getattr(spec, "batched", False):
        _check_batched_scorer(fn, checks)
        return
    for response, label, meta in _SCORER_CASES:
        with checks.check(f"score({response[:20]!r}, {label!r})"):
            try:
                v = fn(response, label, dict(meta))
            except ValueError as e:  # a documented refusal of input it cannot interpret
                require(str(e).strip(), "raised ValueError without a message")
                continue
            require(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)), f"returned {v!r}; expected a finite float or None")


def _check_batched_scorer(fn: Any, checks: Checks) -> None:
    """A batched scorer: one list of finite floats or ``None`` per call, in order, and each
    sample's reward independent of its batch-mates (padding, batch statistics): the whole
    batch scored at once equals each sample scored alone (to 1e-4, float32 batching)."""
    responses, labels, metas = (list(x) for x in zip(*_SCORER_CASES))
    together = None
    with checks.check("score a batch"):
        together = fn(responses, labels, [dict(m) for m in metas])
        require(isinstance(together, list) and len(together) == len(responses),
                f"returned {together!r}; expected a list of {len(responses)} floats or None")
        for v in together:
            require(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)),
                    f"returned {v!r} in its list; expected finite floats or None")
    if together is None:
        return
    with checks.check("a sample's reward does not depend on its batch"):
        alone = [fn([r], [lab], [dict(m)])[0] for r, lab, m in zip(responses, labels, metas)]
        for r, a, b in zip(responses, together, alone):
            require((a is None) == (b is None) and (a is None or abs(a - b) <= 1e-4 * max(1.0, abs(b))),
                    f"{r[:20]!r} scores {a} in the batch but {b} alone")


def check_reward_processor(spec: Any, params: Any, cfg: Any, checks: Checks) -> None:
    proc = None
    with checks.check("build"):
        proc = spec.build(params, cfg)
        require(callable(getattr(proc, "process", None)), "the built object has no process()")
    if proc is None:
        return
    b = synthetic_batch(4)
    n = b.rewards.shape[0]
    with checks.check("process"):
        out = proc.process(RewardBatch(
            rewards=b.rewards, group_index=b.group_index, response_lengths=b.response_lengths,
            truncated=b.response_lengths == T, responses=[f"response {i}" for i in range(n)],
            keep=torch.ones(n, dtype=torch.bool)))
        require(isinstance(out, RewardBatch), f"returned {type(out).__name__}, expected RewardBatch")
        _tensor(out.rewards, "rewards", (n,))
        require(out.rewards.is_floating_point(), "rewards must be float")
        _tensor(out.keep, "keep", (n,), torch.bool)
        _tensor(out.group_index, "group_index", (n,))
        _scalar_metrics(out.metrics, "metrics")


# --------------------------------------------------------------------------- environments

#: the row an environment's episode is checked on
TOY_ROW = {"prompt": "What is 2 + 3?", "label": "5", "metadata": {}}


def check_environment(spec: Any, params: Any, caps: Any, cfg: Any, checks: Checks) -> None:
    """An episode of :data:`TOY_ROW` with the answers ``"5"`` (score 1) or ``"4"`` (score 0)
    in turn: each step returns a well-formed :class:`~relax_core.environments.Reply`, and an
    environment not declaring ``multi_turn`` is done after its first turn."""
    from relax_core.environments import Reply, Turn

    env = None
    with checks.check("build"):
        env = spec.build(params, cfg)
        require(callable(getattr(env, "start", None)), "the built object has no start(row)")
    if env is None:
        return
    with checks.check("episode"):
        episode = env.start(dict(TOY_ROW))
        require(callable(getattr(episode, "step", None)), "start(row) returned an object without step(turn)")
        for k in range(8):
            text = "4" if k % 2 == 0 else "5"
            reply = episode.step(Turn(text=text, index=k, score=float(text == "5") if caps.scores_turns else None))
            require(isinstance(reply, Reply), f"step returned {type(reply).__name__}, expected Reply")
            require(reply.reward is None or math.isfinite(reply.reward), f"reward {reply.reward} is not finite")
            for m in reply.messages:
                require(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str),
                        f"reply message {m!r} is not a {{'role': str, 'content': str}} dict")
            if not caps.multi_turn:
                require(reply.done, "does not declare multi_turn but is not done after its first turn")
            if reply.done:
                break
