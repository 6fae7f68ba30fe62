"""MoE routing record and replay (R3) for Hugging Face transformers mixture-of-experts models.

Source: Ma et al. 2025, "Stabilizing MoE Reinforcement Learning by Aligning Training and
Inference Routers" (arXiv:2510.11370), and the Routing replay section of the corrections guide
(``docs/guide/corrections.md``).  An MoE layer computes
``F(x) = Σ_{i ∈ I(x)} g_i(x) E_i(x)`` with ``I = TopK(u(x))``; near a top-k boundary a tiny
numerical difference between the rollout engine and the trainer switches an expert.  R3
records the rollout's expert sets ``I_q`` and forces them in the training forward: the
*selection* is replayed, while the gate values ``g_i`` (computed from the trainer's router
logits with the model's own gate rule) and the experts stay differentiable.

Two context managers, both implemented with forward hooks on the model's router modules
(``mlp.gate`` of type ``*TopKRouter`` in transformers >= 5, which return
``(router_logits [N, X], router_scores [N, E], router_indices [N, E])`` for the ``N``
flattened tokens of a ``[B, S]`` forward; ``X`` = experts, ``E`` = experts per token)::

    with record_routes(model) as rec:          # rollout engine
        out = model.generate(input_ids, ...)   # left-padded prompts, width P
    routes = rec.routes()                      # long [B, P + T - 1, L, E], every fed position
    routed = routes[:, P - 1:]                 # long [B, T, L, E]; set -1 past each response's end

    with replay_routes(model, routed, positions):   # training backend
        logits = model(input_ids=prompt_and_response, ...).logits

``routed[b, t]`` holds the experts of the forward *input* position that predicts response
token ``t`` (the last prompt token for ``t = 0``, response token ``t - 1`` after), the
layout of ``RolloutBatch.routed_experts``.  In the training forward over prompt + response,
that input sits at ``positions[b, t] = (index of the first response token of sample b) - 1 + t``.
Replay is keyed by ``(sample, layer, position)``, never by call order, so any number of
forwards (old log-probs, the training forward, activation recomputation) replay the same
routes.  Positions absent from the table, and tokens whose rows are ``-1`` (the padding
sentinel, never expert 0), route normally.  To also replay the prompt's own routes, pass ``routes`` with
``positions = arange(S)`` (after aligning the padding of both layouts).

``L`` counts the router modules in ``model.named_modules()`` order (dense layers of a
partly sparse model are skipped).  Supported router classes and their gate rule:
:data:`GATE_RULES`; another class raises ``ValueError`` naming it.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import Tensor, nn

#: The sentinel for "no route recorded" in ``routed_experts`` (never expert 0).
PAD_EXPERT = -1


@dataclass(frozen=True)
class GateRule:
    """How a router turns its logits and a chosen expert set into gate values.

    ``scores = softmax(logits.float()).gather(idx)``; then divided by their sum when
    ``renormalize`` (``True``, or the name of a boolean attribute of the router such as
    ``norm_topk_prob``); then cast back to the logits' dtype when ``cast_to_logits_dtype``.
    """

    renormalize: bool | str
    cast_to_logits_dtype: bool

    def scores(self, router: nn.Module, logits: Tensor, idx: Tensor) -> Tensor:
        probs = torch.softmax(logits.float(), dim=-1)  # [N, X]
        top = probs.gather(-1, idx)  # [N, E]
        renorm = self.renormalize if isinstance(self.renormalize, bool) else getattr(router, self.renormalize)
        if renorm:
            top = top / top.sum(dim=-1, keepdim=True)
        return top.to(logits.dtype) if self.cast_to_logits_dtype else top


#: Router class name -> gate rule (transformers 5.x modeling files, checked against 5.19).
GATE_RULES: dict[str, GateRule] = {
    "Qwen3MoeTopKRouter": GateRule("norm_topk_prob", True),
    "Qwen2MoeTopKRouter": GateRule("norm_topk_prob", True),
    "Qwen3NextTopKRouter": GateRule("norm_topk_prob", True),
    "OlmoeTopKRouter": GateRule("norm_topk_prob", True),
    "Qwen3_5MoeTopKRouter": GateRule(True, True),
    "MixtralTopKRouter": GateRule(True, False),
}


def moe_routers(model: nn.Module) -> list[nn.Module]:
    """The router modules of ``model`` in layer order (``named_modules`` order).

    A router is a module whose class name ends with ``TopKRouter``.  Raises ``ValueError``
    if one has no entry in :data:`GATE_RULES` (its gate rule is unknown, so replay could
    silently change the gate values)."""
    routers = [m for _, m in model.named_modules() if type(m).__name__.endswith("TopKRouter")]
    unknown = sorted({type(m).__name__ for m in routers} - set(GATE_RULES))
    if unknown:
        raise ValueError(f"routing replay does not know the gate rule of {', '.join(unknown)}; "
                         f"supported routers: {', '.join(sorted(GATE_RULES))}")
    return routers


def is_moe(model: nn.Module) -> bool:
    """Whether ``model`` has at least one MoE router (supported or not)."""
    return any(type(m).__name__.endswith("TopKRouter") for m in model.modules())


def _parents(model: nn.Module, routers: list[nn.Module]) -> list[nn.Module]:
    """The module that owns each router (the sparse MoE block, whose input is ``[B, S, H]``)."""
    ids = {id(r): i for i, r in enumerate(routers)}
    out: list[nn.Module | None] = [None] * len(routers)
    for parent in model.modules():
        for child in parent.children():
            if id(child) in ids:
                out[ids[id(child)]] = parent
    return out  # type: ignore[return-value]


class _Shapes:
    """Pre-hooks on each MoE block remembering the ``[B, S]`` of its current input, so that
    a router's flattened ``[N, ...]`` outputs can be unflattened."""

    def __init__(self, model: nn.Module, routers: list[nn.Module]):
        self.bs: list[tuple[int, int] | None] = [None] * len(routers)
        self.handles = []
        for i, parent in enumerate(_parents(model, routers)):
            self.handles.append(parent.register_forward_pre_hook(self._hook(i), with_kwargs=True))

    def _hook(self, i: int):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs.get("hidden_states")
            if x is None or x.dim() != 3:
                raise ValueError(f"MoE block {type(module).__name__} expects hidden states [B, S, H]")
            self.bs[i] = (int(x.shape[0]), int(x.shape[1]))
        return hook

    def get(self, i: int, n: int) -> tuple[int, int]:
        bs = self.bs[i]
        if bs is None or bs[0] * bs[1] != n:
            raise RuntimeError(f"router {i} saw {n} tokens, which does not match its MoE block input {bs}")
        return bs

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class RouteRecorder:
    """Collects the expert ids every router chose, for every forward inside
    :func:`record_routes` (e.g. the prefill and each decode step of one ``generate``)."""

    def __init__(self, routers: list[nn.Module]):
        self.num_layers = len(routers)
        self._chunks: list[list[Tensor]] = [[] for _ in routers]  # per layer: [B, S_i, E]

    def _add(self, layer: int, ids: Tensor) -> None:
        self._chunks[layer].append(ids.detach().to("cpu", torch.long))

    def reset(self) -> None:
        """Forget what was recorded (to record another ``generate`` call)."""
        for c in self._chunks:
            c.clear()

    def routes(self) -> Tensor:
        """long ``[B, S, L, E]``: for each sample, each position fed to the model (in the
        order fed: prompt positions of the prefill, then one per decode step), each MoE
        layer, the chosen expert ids.  Raises ``RuntimeError`` if nothing was recorded or
        the layers saw different calls."""
        if not self._chunks or not self._chunks[0]:
            raise RuntimeError("no routes recorded: run the model inside record_routes(model)")
        per_layer = [torch.cat(c, dim=1) for c in self._chunks]  # L × [B, S, E]
        if len({t.shape for t in per_layer}) != 1:
            raise RuntimeError(f"MoE layers recorded different shapes: {sorted({tuple(t.shape) for t in per_layer})}")
        return torch.stack(per_layer, dim=2)  # [B, S, L, E]


@contextmanager
def record_routes(model: nn.Module) -> Iterator[RouteRecorder]:
    """Record the experts each MoE router of ``model`` picks, inside the context.

    Yields a :class:`RouteRecorder`; call ``.routes()`` after the forwards (or
    ``generate``).  Raises ``ValueError`` if ``model`` has no supported router (a dense
    model: R3 has no meaning there) or has an unsupported one.  Hooks are removed on exit.
    """
    routers = moe_routers(model)
    if not routers:
        raise ValueError(f"{type(model).__name__} has no mixture-of-experts router: nothing to record")
    rec = RouteRecorder(routers)
    shapes = _Shapes(model, routers)

    def hook_for(i: int):
        def hook(module, args, output):
            idx = output[2]  # [N, E]
            b, s = shapes.get(i, idx.shape[0])
            rec._add(i, idx.reshape(b, s, -1))
        return hook

    handles = [r.register_forward_hook(hook_for(i)) for i, r in enumerate(routers)]
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()
        shapes.remove()


def _used_rows(routed: Tensor, positions: Tensor, num_layers: int, num_experts: int) -> tuple[Tensor, Tensor]:
    """Validate a replay table; return the ``(sample, row)`` indices of the rows to force."""
    if routed.dim() != 4 or routed.shape[2] != num_layers:
        raise ValueError(f"routed_experts must be [B, S, L={num_layers}, E], got {tuple(routed.shape)}")
    if positions.shape != routed.shape[:2]:
        raise ValueError(f"positions must be [B, S] = {tuple(routed.shape[:2])}, got {tuple(positions.shape)}")
    pad = routed == PAD_EXPERT
    token_pad = pad.flatten(2).all(-1)  # [B, S]: a token is recorded in every layer or in none
    if (pad.flatten(2).any(-1) & ~token_pad).any():
        raise ValueError("routed_experts has tokens mixing expert ids and the -1 sentinel")
    ok = token_pad[..., None, None] | ((routed >= 0) & (routed < num_experts))
    if not ok.all():
        raise ValueError(f"routed_experts has ids outside [0, {num_experts})")
    srt = routed.sort(-1).values
    if ((srt[..., 1:] == srt[..., :-1]) & ~token_pad[..., None, None]).any():
        raise ValueError("routed_experts has a repeated expert in one row")
    used = ~token_pad & (positions >= 0)
    b_idx, s_idx = used.nonzero(as_tuple=True)
    key = b_idx * (int(positions.max()) + 1 if positions.numel() else 1) + positions[b_idx, s_idx]
    if key.unique().numel() != key.numel():
        raise ValueError("two rows of routed_experts give routes for the same (sample, position)")
    return b_idx, s_idx


@contextmanager
def replay_routes(model: nn.Module, routed_experts: Tensor, positions: Tensor) -> Iterator[None]:
    """Force each MoE router's selection to recorded expert ids, inside the context.

    Args:
        model: a transformers MoE model with routers listed in :data:`GATE_RULES`.
        routed_experts: long ``[B, S, L, E]`` recorded expert ids (a token whose rows are
            all ``-1`` in every layer was not recorded: it routes normally).  ``B`` must
            equal the batch of each forward inside the context.
        positions: long ``[B, S]`` index, in the forward's sequence dimension, of the token
            each row belongs to (``-1`` = unused row).  E.g. for response-aligned routes
            (``RolloutBatch.routed_experts``): first response index of sample ``b`` minus 1 plus ``t``.

    The router still computes its logits; the hook returns ``(logits, scores, idx)`` with
    ``idx`` the recorded ids where given (else the router's own choice) and ``scores`` the
    model's gate rule applied at ``idx`` — differentiable with respect to the router
    weights and the hidden states.  Raises ``ValueError`` on a malformed table (wrong
    shape, ids out of range, repeated ids in a row, a token partly -1, two rows for one
    (sample, position)), ``RuntimeError`` if a forward's batch differs from ``B`` or a
    position is beyond its sequence length.
    """
    routers = moe_routers(model)
    if not routers:
        raise ValueError(f"{type(model).__name__} has no mixture-of-experts router: nothing to replay")
    routed_experts = routed_experts.long()
    positions = positions.long()
    b_idx, s_idx = _used_rows(routed_experts, positions, len(routers), int(routers[0].num_experts))
    shapes = _Shapes(model, routers)
    pos = positions[b_idx, s_idx]  # [K]
    table = routed_experts[b_idx, s_idx]  # [K, L, E]

    def hook_for(i: int, rule: GateRule):
        def hook(module, args, output):
            logits, _, natural = output
            b, s = shapes.get(i, logits.shape[0])
            if b != routed_experts.shape[0]:
                raise RuntimeError(f"replay table has {routed_experts.shape[0]} samples, the forward has {b}")
            if pos.numel() and int(pos.max()) >= s:
                raise RuntimeError(f"replay position {int(pos.max())} is beyond the forward's length {s}")
            dev = natural.device
            flat = (b_idx * s + pos).to(dev)  # [K] rows of the flattened [B*S] tokens
            idx = natural.clone()
            idx[flat] = table[:, i].to(dev, natural.dtype)
            return logits, rule.scores(module, logits, idx), idx
        return hook

    handles = [r.register_forward_hook(hook_for(i, GATE_RULES[type(r).__name__])) for i, r in enumerate(routers)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        shapes.remove()
