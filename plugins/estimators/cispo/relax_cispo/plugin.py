"""Hook implementations of relax-cispo (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import EstimatorCapabilities, EstimatorSpec, GroupAdvantageParams, PPOClipParams, hookimpl


@dataclass(frozen=True)
class CISPOParams(PPOClipParams, GroupAdvantageParams):
    """The clip band of the IS weight (no dual clip) and the group-advantage block."""


CAPABILITIES = EstimatorCapabilities(
    supports_loss_mask_holes=True,  # verified by the contract kit (with_holes)
    accepts_advantage_terms=True,  # token-local weight × A_t: a per-token advantage term is per-token credit
    supports_context_parallel=True,  # token-local loss
    sync_only=False,
    supports_fully_async=True,  # the clipped IS weight corrects stale samples
    min_group_size=2,  # group std of one sample is undefined
    requires_complete_groups=True,
    requires_per_token_loss=True,  # the spec normalises by the total response tokens
    behaviour_numerator="old_log_probs",
    allows_reward_post_processors=True,
    metrics=("rollout/zero_std_group_frac",),
)


@hookimpl
def relax_register_estimators():
    return [EstimatorSpec(
        name="cispo",
        summary="CISPO: GRPO advantages, loss -sg(clip(r, 1-eps, 1+eps_high))·A·log π (gradient through log π only). "
                "Recommended: --eps-clip 0.2 --eps-clip-high 10 --use-kl-loss --kl-loss-coef 0.001 "
                "--kl-loss-type low_var_kl --correction tis --clip-grad 1.0.",
        source="MiniMax 2025, 'MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention', §3.1 eq. (4)-(5)",
        factory="relax_cispo.cispo:build",
        params=CISPOParams,
        capabilities=CAPABILITIES,
    )]
