"""Hook implementations of relax-reinforce-plus-plus-baseline (registration only; nothing heavy imported)."""

from relax_core import DualClipParams, EstimatorCapabilities, EstimatorSpec, hookimpl

CAPABILITIES = EstimatorCapabilities(
    supports_loss_mask_holes=True,  # verified by the contract kit (with_holes)
    accepts_advantage_terms=True,  # PPO-clip per token; the term is added after its own global whitening
    supports_context_parallel=False,
    sync_only=True,
    supports_fully_async=False,
    min_group_size=2,
    requires_complete_groups=True,
    requires_normalize_advantages=True,
    requires_rewards_normalization=True,
    forbids_per_token_loss=True,
    requires_kl_loss=True,
    required_kl_loss_type="k2",
    behaviour_numerator="old_log_probs",
    allows_reward_post_processors=False,
    metrics=("rollout/zero_std_group_frac", "rollout/advantage_raw_std"),
)


@hookimpl
def relax_register_estimators():
    return [EstimatorSpec(
        name="reinforce_plus_plus_baseline",
        summary="REINFORCE++-baseline: inclusive group-mean baseline, global token normalisation, PPO-clip, k2 KL loss.",
        source="Hu et al. 2025, REINFORCE++ (arXiv 2501.03262, v9), §3: REINFORCE++-baseline (group-mean baseline, global normalisation)",
        factory="relax_reinforce_plus_plus_baseline.reinforce_plus_plus_baseline:build",
        params=DualClipParams,
        capabilities=CAPABILITIES,
    )]
