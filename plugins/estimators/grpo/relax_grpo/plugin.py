"""Hook implementations of relax-grpo (registration only; nothing heavy imported)."""

from dataclasses import dataclass, fields

from relax_core import DualClipParams, EstimatorCapabilities, EstimatorSpec, GroupAdvantageParams, hookimpl, param


@dataclass(frozen=True)
class GRPOParams(DualClipParams, GroupAdvantageParams):
    pg_loss_type: str = param(
        "ppo_clip", "ppo_clip (clipped surrogate) or reinforce (-sg(A)·log π, unclipped; for score centering).",
        flag="--pg-loss-type", choices=("ppo_clip", "reinforce"))

    def problems(self) -> list[tuple[str, str]]:
        """The REINFORCE loss has no clip: a clip margin set with it would be a silent no-op."""
        if self.pg_loss_type != "reinforce":
            return []
        unread = [f"{f.metadata['flag']} {v}" for f in fields(DualClipParams)
                  if (v := getattr(self, f.name)) != f.default]
        return [(f"--pg-loss-type reinforce does not read {', '.join(unread)}: set, it would be a silent no-op",
                 "drop those flags, or use --pg-loss-type ppo_clip")] if unread else []


def _capabilities(p: GRPOParams) -> EstimatorCapabilities:
    return EstimatorCapabilities(
        supports_loss_mask_holes=True,  # verified by the contract kit (with_holes)
        accepts_advantage_terms=True,  # PPO-clip or REINFORCE per token: a per-token advantage term is per-token credit
        supports_context_parallel=True,
        sync_only=False,
        supports_fully_async=True,
        min_group_size=2,
        requires_complete_groups=True,
        allows_reward_post_processors=True,
        behaviour_numerator="log_probs" if p.pg_loss_type == "reinforce" else "old_log_probs",
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
