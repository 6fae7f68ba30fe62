"""A throwaway third-party estimator with a loss of its own (no kind Relax knows): a gated
ratio, L_t = −tanh(r_t)·A_t with r_t = π_θ/π_old.  It declares only the fact corrections
read, ``behaviour_numerator="old_log_probs"`` (its loss has a ratio to the old policy); two
twins with the same loss declare ``log_probs`` and nothing.  Used by
``test_third_party_estimator.py``."""

from __future__ import annotations

import torch

from relax_core import EstimatorCapabilities, EstimatorSpec, hookimpl
from relax_core.contracts import AdvantageInput, AdvantageOutput, PolicyLossInput, PolicyLossOutput
from relax_core.numerics import broadcast_to_tokens


class GatedRatio:
    """L_t = −tanh(r_t)·A_t, r_t = exp(log π_θ − log π_old): a ratio to the old policy."""

    def compute_advantages(self, inp: AdvantageInput) -> AdvantageOutput:
        adv = broadcast_to_tokens(inp.rewards.float(), inp.loss_mask)
        return AdvantageOutput(advantages=adv, returns=adv)

    def policy_loss(self, inp: PolicyLossInput) -> PolicyLossOutput:
        m = inp.loss_mask.bool()
        r = torch.exp(torch.where(m, inp.log_probs - inp.old_log_probs, 0.0))
        return PolicyLossOutput(loss=torch.where(m, -torch.tanh(r) * torch.where(m, inp.advantages, 0.0), 0.0))


def build(params, config) -> GatedRatio:
    return GatedRatio()


def _spec(name: str, numerator: str | None) -> EstimatorSpec:
    return EstimatorSpec(name=name, summary="third-party toy", source="tests", factory="relax_toy_estimator:build",
                         capabilities=EstimatorCapabilities(sync_only=False, behaviour_numerator=numerator))


class Plugin:
    @hookimpl
    def relax_register_estimators(self):
        return [_spec("gated", "old_log_probs"), _spec("gated_free", "log_probs"), _spec("gated_undeclared", None)]
