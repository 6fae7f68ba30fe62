"""Rollout routing replay (R3) for mixture-of-experts models.

Source: Ma et al. 2025, "Stabilizing MoE Reinforcement Learning by Aligning Training and
Inference Routers" (arXiv:2510.11370); the Routing replay section
of the corrections guide (``docs/guide/corrections.md``).

Writing an MoE layer as F(x) = Σ_{i ∈ I(x)} g_i(x) E_i(x) with I = TopK(u(x)), the
difference between the engine's and the trainer's outputs splits into a same-routes term
F_{I_q}(x_q) − F_{I_q}(x_p) and an expert-selection term F_{I_q}(x_p) − F_{I_p}(x_p).  Replaying
the engine's I_q in the training forward removes the second term; the gates g_i and the
experts stay differentiable.

The work happens outside the loss: the engine records ``routed_experts [B, T, L, E]`` with
:func:`relax_routing_replay.routes.record_routes` and the backend replays them with
:func:`relax_routing_replay.routes.replay_routes` (both selected by this plugin's capabilities
``requires_fields={"routed_experts"}``, ``needs_routing_replay``).  ``apply`` therefore returns the loss unchanged.
"""

from __future__ import annotations

from typing import Any

from relax_core.contracts import CorrectionInput, CorrectionOutput


class RoutingReplay:
    """The R3 correction: identity on the loss (the replay is in the forward)."""

    def apply(self, inp: CorrectionInput) -> CorrectionOutput:
        """Returns ``inp.loss`` unchanged."""
        return CorrectionOutput(loss=inp.loss)


def build(params: Any, config: Any) -> RoutingReplay:
    return RoutingReplay()
