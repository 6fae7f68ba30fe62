"""Hook implementations of relax-rloo (registration only; nothing heavy imported)."""

from relax_core import EstimatorCapabilities, EstimatorSpec, hookimpl

METRICS = (
    "rollout/rloo/baseline_mean",
    "rollout/rloo/adv_abs_mean",
    "rollout/rloo/no_signal_frac",
    "rollout/rloo/empty_response_frac",
    "rollout/rloo/zero_adv_group_frac",
    "rollout/rloo/dropped_group_frac",
)

#: The constraint table of the spec (algorithms-reference, RLOO "约束与参数").
CAPABILITIES = EstimatorCapabilities(
    supports_loss_mask_holes=True,  # verified by the contract kit (with_holes)
    accepts_advantage_terms=True,  # REINFORCE per token: a per-token advantage term is per-token credit
    supports_context_parallel=True,  # token-local loss: each token needs only its own log π
    sync_only=True,  # unclipped, no importance ratio: on-policy, one update per rollout
    supports_fully_async=False,
    min_group_size=2,
    requires_complete_groups=True,
    requires_rewards_normalization=True,
    forbids_normalize_advantages=True,
    requires_per_token_loss=True,
    behaviour_numerator="log_probs",
    allows_reward_post_processors=True,  # diagnostics are then omitted
    metrics=METRICS,
)


@hookimpl
def relax_register_estimators():
    return [EstimatorSpec(
        name="rloo",
        summary="REINFORCE Leave-One-Out: A = R - mean of the other samples of the group, unclipped -sg(A)·log π, "
                "token-mean over the global batch; synchronous only.",
        source="Ahmadian et al. 2024, 'Back to Basics: Revisiting REINFORCE Style Optimization for Learning "
               "from Human Feedback in LLMs', §3.2 eq. (5); Kool et al. 2019",
        factory="relax_rloo.rloo:build",
        capabilities=CAPABILITIES,
    )]
