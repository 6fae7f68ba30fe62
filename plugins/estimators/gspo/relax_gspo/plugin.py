"""Hook implementations of relax-gspo (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import DualClipParams, EstimatorCapabilities, EstimatorSpec, GroupAdvantageParams, hookimpl


@dataclass(frozen=True)
class GSPOParams(DualClipParams, GroupAdvantageParams):
    """The clip block (on the sequence ratio) and the group-advantage block."""


CAPABILITIES = EstimatorCapabilities(
    supports_loss_mask_holes=True,  # verified by the contract kit (with_holes)
    # one ratio per sequence: the gradient of each token carries the sequence's mean advantage, so a
    # per-token term (distillation) would be averaged over the sequence, not credited per token
    accepts_advantage_terms=False,
    # The ratio of a token depends on its whole sequence's log-ratios: a context-parallel
    # shard cannot compute it alone (not verified with all-reduced sums), so CP is refused.
    supports_context_parallel=False,
    sync_only=False,
    supports_fully_async=True,
    min_group_size=2,
    requires_complete_groups=True,
    forbids_per_token_loss=True,  # one ratio per sequence: the objective is a per-sample mean
    kl_level="sequence",
    needs_full_sequence=True,
    behaviour_numerator="old_log_probs",
    allows_reward_post_processors=True,
    metrics=("rollout/zero_std_group_frac",),
)


@hookimpl
def relax_register_estimators():
    return [EstimatorSpec(
        name="gspo",
        summary="GSPO: GRPO advantages, PPO-clip on one ratio per sequence r = exp(mean_t(log π - log π_old)).",
        source="Zheng et al. 2025, 'Group Sequence Policy Optimization', §4.1 eq. (5)-(7)",
        factory="relax_gspo.gspo:build",
        params=GSPOParams,
        capabilities=CAPABILITIES,
    )]
