"""Token log-probabilities, entropy and top-k log-probs from hidden states, chunked over
tokens so that the ``[N, V]`` logits never exist all at once (forward or backward).

For hidden states ``h`` (``[N, H]``), the output embedding ``W`` (``[V, H]``, optional bias
``c``) and an inverse temperature ``β = 1/τ``:

    z = β (h Wᵀ + c)                      logits at temperature τ,        [N, V]
    log p_y = z_y − logsumexp(z)          log-prob of the target token y, [N]
    H = logsumexp(z) − Σ_v p_v z_v        entropy of p = softmax(z),      [N]
      = log Σ_v e^{z'_v} − Σ_v e^{z'_v} z'_v / Σ_v e^{z'_v},   z' = z − max z
    log p_v, v ∈ ids                      log-probs at given ids,         [N, k]

The backward recomputes each chunk's logits and applies the analytic gradients

    ∂ log p_y / ∂z_j = 1[j = y] − p_j
    ∂ H / ∂z_j       = −p_j (z_j − Σ_v p_v z_v)

then ``∂z/∂h = β W``, ``∂z/∂W = β h``, ``∂z/∂c = β``, with ``p = exp(z − logsumexp(z))``
from the ``logsumexp`` saved by the forward.  An output that does not reach the loss (the
entropy when it is only a metric) gets no gradient term.  Memory is O(chunk × V) instead of
O(N × V).  Computation is in float32 (float64 when the weights are float64) with autocast
off, whatever the dtype of ``h``.  The entropy is computed from the shifted logits ``z'``
(no cancellation of two numbers of the size of ``logsumexp(z)``) with element-wise sums
over the vocabulary (pairwise, unlike one float32 matrix product per row, whose error grows
with V): on SmolLM2's 49 152-token vocabulary it agrees with a float64 reference to about
1e-5 nats per token.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _compute_dtype(h: Tensor, w: Tensor) -> torch.dtype:
    return torch.promote_types(torch.promote_types(torch.float32, w.dtype), h.dtype)


def _logits(h: Tensor, w: Tensor, b: Tensor | None, beta: float, dt: torch.dtype) -> Tensor:
    """``β (h Wᵀ + c)`` as ``(β h) Wᵀ + β c``: β scales the ``[c, H]`` rows, not the ``[c, V]`` logits."""
    h = h.to(dt) if beta == 1.0 else h.to(dt) * beta
    if b is None:
        return h @ w.to(dt).T
    return torch.addmm(b.to(dt) if beta == 1.0 else b.to(dt) * beta, h, w.to(dt).T)


class _TokenLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, b, targets, top_ids, beta, chunk, want_entropy):
        ctx.set_materialize_grads(False)  # an output outside the loss gets None, not zeros
        dt = _compute_dtype(h, w)
        n = h.shape[0]
        logp = torch.empty(n, dtype=dt, device=h.device)
        lse = torch.empty(n, dtype=dt, device=h.device)
        ent = torch.empty(n, dtype=dt, device=h.device) if want_entropy else None
        top = torch.empty(tuple(top_ids.shape), dtype=dt, device=h.device) if top_ids is not None else None
        with torch.autocast(h.device.type, enabled=False):
            for s in range(0, n, chunk):
                e = min(n, s + chunk)
                z = _logits(h[s:e], w, b, beta, dt)  # [c, V]
                m = z.amax(-1, keepdim=True)  # [c, 1]
                ez = torch.sub(z, m).exp_()  # exp(z − max z), [c, V]
                total = ez.sum(-1)  # [c]
                lse[s:e] = m.squeeze(1) + total.log()
                logp[s:e] = z.gather(1, targets[s:e, None]).squeeze(1) - lse[s:e]
                if top is not None:
                    top[s:e] = z.gather(1, top_ids[s:e]) - lse[s:e, None]
                if ent is not None:  # H = log Σ ez − Σ ez·z' / Σ ez, z' = z − max z, an element-wise (pairwise) sum
                    ent[s:e] = total.log() - ez.mul_(z.sub_(m)).sum(-1) / total
                del ez
        ctx.save_for_backward(h, w, b, targets, top_ids, lse)
        ctx.beta, ctx.chunk, ctx.dt = beta, chunk, dt
        return logp, ent, top

    @staticmethod
    def backward(ctx, g_logp, g_ent, g_top):
        h, w, b, targets, top_ids, lse = ctx.saved_tensors
        beta, chunk, dt = ctx.beta, ctx.chunk, ctx.dt
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = torch.zeros(w.shape, dtype=dt, device=w.device) if need_w else None
        grad_b = torch.zeros(b.shape, dtype=dt, device=b.device) if need_b and b is not None else None
        if g_top is None or top_ids is None:
            g_top = None
        with torch.autocast(h.device.type, enabled=False):
            wd = w.to(dt)
            for s in range(0, h.shape[0], chunk):
                e = min(h.shape[0], s + chunk)
                hc = h[s:e].to(dt)
                z = _logits(h[s:e], w, b, beta, dt)  # [c, V]
                p = torch.sub(z, lse[s:e, None]).exp_()  # softmax(z), [c, V]
                # β·∂/∂z = β·(one-hot terms) − β p (Σ g_logp + Σ g_top + g_ent (z − Σ p z)), built in z's storage
                coef = torch.zeros(e - s, 1, dtype=dt, device=h.device)  # total weight of the "−p" terms
                if g_logp is not None:
                    coef += g_logp[s:e].to(dt)[:, None]
                if g_top is not None:
                    coef += g_top[s:e].to(dt).sum(-1, keepdim=True)
                if g_ent is not None:
                    z.sub_(lse[s:e, None])  # log p ≤ 0 (shift-invariant: z_j − Σ p z = log p_j − Σ p log p)
                    pz = (p * z).sum(-1, keepdim=True)  # Σ_v p_v log p_v, an element-wise sum, [c, 1]
                    gz = z.sub_(pz).mul_(g_ent[s:e].to(dt)[:, None] * -beta).sub_(coef * beta).mul_(p)
                else:
                    gz = p.mul_(coef * -beta)
                if g_logp is not None:
                    gz.scatter_add_(1, targets[s:e, None], g_logp[s:e].to(dt)[:, None] * beta)
                if g_top is not None:
                    gz.scatter_add_(1, top_ids[s:e], g_top[s:e].to(dt) * beta)
                if need_h:
                    grad_h[s:e] = (gz @ wd).to(h.dtype)
                if need_w:
                    grad_w += gz.T @ hc
                if grad_b is not None:
                    grad_b += gz.sum(0)
        return (grad_h, None if grad_w is None else grad_w.to(w.dtype),
                None if grad_b is None else grad_b.to(b.dtype), None, None, None, None, None)


def token_log_probs(hidden: Tensor, weight: Tensor, targets: Tensor, *, bias: Tensor | None = None,
                    temperature: float = 1.0, top_ids: Tensor | None = None, entropy: bool = False,
                    chunk: int = 512) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Log-probs of ``targets`` (and optionally entropy and log-probs at ``top_ids``)
    under ``softmax((hidden @ weightᵀ + bias) / temperature)``, full vocabulary.

    Args:
        hidden: ``[N, H]`` final hidden states (any float dtype; may require grad).
        weight: ``[V, H]`` output embedding (may require grad; float32 or float64).
        targets: long ``[N]`` token ids in ``[0, V)``.
        bias: optional ``[V]``.
        temperature: τ > 0.
        top_ids: optional long ``[N, k]`` ids at which to return log-probs.
        entropy: also return the entropy (nats).
        chunk: tokens per chunk (memory O(chunk × V)).

    Returns:
        ``(log_probs [N], entropy [N] or None, top_log_probs [N, k] or None)`` in float32
        (float64 for float64 weights), differentiable in ``hidden``, ``weight`` and ``bias``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return _TokenLogProbs.apply(hidden, weight, bias, targets, top_ids, 1.0 / temperature, int(chunk), bool(entropy))
