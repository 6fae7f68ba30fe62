"""Hook implementations of relax-sapo (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import EstimatorCapabilities, EstimatorSpec, GroupAdvantageParams, hookimpl, param


@dataclass(frozen=True)
class SAPOParams(GroupAdvantageParams):
    tau_pos: float = param(1.0, "Gate temperature for tokens with positive advantage.",
                           flag="--sapo-tau-pos", gt=0)
    tau_neg: float = param(1.05, "Gate temperature for tokens with advantage <= 0 (higher = stronger damping).",
                           flag="--sapo-tau-neg", gt=0)


CAPABILITIES = EstimatorCapabilities(
    supports_loss_mask_holes=True,  # verified by the contract kit (with_holes)
    accepts_advantage_terms=True,  # soft gate per token: a per-token advantage term is per-token credit
    supports_context_parallel=True,  # token-local loss
    sync_only=False,
    supports_fully_async=True,
    min_group_size=2,
    requires_complete_groups=True,
    behaviour_numerator="old_log_probs",
    allows_reward_post_processors=True,
    metrics=("rollout/zero_std_group_frac",),
)


@hookimpl
def relax_register_estimators():
    return [EstimatorSpec(
        name="sapo",
        summary="SAPO: GRPO advantages, smooth sigmoid gate instead of a hard clip: loss -(4/tau)·sigmoid(tau(r-1))·A.",
        source="Qwen team 2025, 'Soft Adaptive Policy Optimization' (soft gate f(r) = (4/τ)σ(τ(r−1)), "
               "τ by advantage sign); Relax algorithms reference, SAPO",
        factory="relax_sapo.sapo:build",
        params=SAPOParams,
        capabilities=CAPABILITIES,
    )]
