"""Hook implementations of relax-grpo (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import EstimatorCapabilities, EstimatorSpec, GroupAdvantageParams, hookimpl, param


@dataclass(frozen=True)
class GRPOParams(GroupAdvantageParams):
    pg_loss_type: str = param(
        "ppo_clip", "ppo_clip (clipped surrogate) or reinforce (-sg(A)·log π, unclipped; for score centering).",
        flag="--pg-loss-type", choices=("ppo_clip", "reinforce"))


def _capabilities(p: GRPOParams) -> EstimatorCapabilities:
    return EstimatorCapabilities(
        supports_context_parallel=True,
        sync_only=False,
        supports_fully_async=True,
        min_group_size=2,
        requires_complete_groups=True,
        allows_reward_post_processors=True,
        policy_loss_kind="reinforce" if p.pg_loss_type == "reinforce" else "ppo_clip",
        uses_options=frozenset() if p.pg_loss_type == "reinforce" else frozenset({"eps_clip", "eps_clip_high", "eps_clip_c"}),
        metrics=("rollout/zero_std_group_frac",),
    )


@hookimpl
def relax_register_estimators():
    return [EstimatorSpec(
        name="grpo",
        summary="Group Relative Policy Optimization: group-normalised rewards, PPO-clip loss.",
        source="Shao et al. 2024, DeepSeekMath, §4.1.2 eq. (3); Dr.GRPO: Liu et al. 2025 §3.1",
        factory="relax_grpo.grpo:build",
        params=GRPOParams,
        capabilities=_capabilities,
    )]
