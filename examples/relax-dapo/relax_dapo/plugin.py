"""Hook implementations of relax-dapo (registration only: nothing heavy is imported)."""

from dataclasses import dataclass

from relax_core import EstimatorCapabilities, EstimatorSpec, hookimpl, param


@dataclass(frozen=True)
class DAPOParams:
    clip_low: float = param(0.2, "ε_low: the ratio's lower bound is 1 − ε_low.", ge=0.0, lt=1.0)
    clip_high: float = param(0.28, "ε_high (Clip-Higher): the ratio's upper bound is 1 + ε_high.", ge=0.0)


@hookimpl
def relax_register_estimators():
    return [EstimatorSpec(
        name="dapo",
        summary="DAPO: group-normalised rewards, decoupled (Clip-Higher) PPO-clip, token-level loss.",
        source="Yu et al. 2025, DAPO: An Open-Source LLM Reinforcement Learning System at Scale, §3, eq. (8)",
        factory="relax_dapo.dapo:build",
        params=DAPOParams,
        capabilities=EstimatorCapabilities(
            supports_context_parallel=True,
            sync_only=False,
            supports_fully_async=True,
            min_group_size=2,
            requires_complete_groups=True,
            requires_per_token_loss=True,
            allows_reward_post_processors=True,
            behaviour_numerator="old_log_probs",
            metrics=("rollout/zero_std_group_frac",),
        ),
    )]
