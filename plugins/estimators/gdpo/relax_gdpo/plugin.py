"""Hook implementations of relax-gdpo (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import DualClipParams, EstimatorCapabilities, EstimatorSpec, hookimpl


@dataclass(frozen=True)
class GDPOParams(DualClipParams):
    pass


def _capabilities(p: GDPOParams) -> EstimatorCapabilities:
    return EstimatorCapabilities(
        requires_fields=frozenset({"reward_parts"}),  # several --reward: each normalised on its own
        requires_rewards_normalization=True,  # it is a normalisation: --disable-rewards-normalization would undo it
        allows_reward_post_processors=False,  # it reads each scorer's raw reward, which no post-processor shapes
        supports_loss_mask_holes=True,  # verified by the contract kit (with_holes)
        accepts_advantage_terms=True,  # PPO-clip per token
        supports_context_parallel=True,
        sync_only=False,
        supports_fully_async=True,
        min_group_size=2,
        requires_complete_groups=True,
        behaviour_numerator="old_log_probs",
        metrics=("rollout/zero_std_group_frac",),
    )


@hookimpl
def relax_register_estimators():
    return [EstimatorSpec(
        name="gdpo",
        summary="Group reward-Decoupled Normalization: each --reward group-normalised on its own, the weighted "
                "sum batch-normalised; PPO-clip loss.",
        source="Liu et al. 2026, 'GDPO: Group reward-Decoupled Normalization Policy Optimization for Multi-reward "
               "RL Optimization', arXiv 2601.05242, §3",
        factory="relax_gdpo.gdpo:build",
        params=GDPOParams,
        capabilities=_capabilities,
    )]
