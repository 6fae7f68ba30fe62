"""Hook implementations of relax-reinforce-plus-plus (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import DualClipParams, EstimatorCapabilities, EstimatorSpec, hookimpl, param


@dataclass(frozen=True)
class ReinforcePlusPlusParams(DualClipParams):
    gamma: float = param(1.0, "Discount γ of the token return G_t = Σ_{u≥t} γ^(u−t) r_u.", flag="--gamma", ge=0, le=1)


CAPABILITIES = EstimatorCapabilities(
    supports_loss_mask_holes=True,  # verified by the contract kit (with_holes)
    accepts_advantage_terms=True,  # PPO-clip per token; the term is added after its own global whitening
    supports_context_parallel=False,
    sync_only=True,
    supports_fully_async=False,
    min_group_size=1,
    requires_complete_groups=False,
    requires_normalize_advantages=True,
    forbids_per_token_loss=True,
    uses_options=frozenset({"kl_coef"}),
    requires_reward_side_kl=True,
    required_kl_loss_type="k1",
    forbids_kl_loss=True,
    behaviour_numerator="old_log_probs",
    allows_reward_post_processors=True,
    metrics=("rollout/return_mean", "rollout/return_std", "rollout/reward_kl"),
)


@hookimpl
def relax_register_estimators():
    return [EstimatorSpec(
        name="reinforce_plus_plus",
        summary="REINFORCE++: k1-KL-shaped token returns, global token normalisation, PPO-clip.",
        source="Hu et al. 2025, REINFORCE++ (arXiv 2501.03262, v9), §3: token-level KL penalty, global advantage normalisation",
        factory="relax_reinforce_plus_plus.reinforce_plus_plus:build",
        params=ReinforcePlusPlusParams,
        capabilities=CAPABILITIES,
    )]
