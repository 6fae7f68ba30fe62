"""Hook implementations of relax-m2po (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import EstimatorCapabilities, EstimatorSpec, hookimpl, param

_WHY_FLOORS = ("0.3 / 0.5 are the upstream Relax defaults (kept so that runs compare with it); its M2PO recipe "
               "recommends the clip-higher margins 0.2 / 0.28, a tighter floor that leaves the adaptive band more say")

METRICS = ("train/ppo_kl_m2_before", "train/ppo_kl_m2_after", "train/m2po_eps_low", "train/m2po_eps_high")


@dataclass(frozen=True)
class M2POParams:
    kl2_budget: float = param(
        0.01, "Budget on the second moment of log r over harmful tokens; above it the clip band tightens.",
        flag="--m2po-kl2-budget", ge=0, recommended="0.01-0.04 (paper: 0.04)")
    miniclip_low: float = param(
        0.3, "Floor of the lower clip margin (the band is never tighter than 1 - this).",
        flag="--m2po-miniclip-low", ge=0, le=1, recommended=0.2, why_default=_WHY_FLOORS)
    miniclip_high: float = param(
        0.5, "Floor of the upper clip margin (the band is never tighter than 1 + this).",
        flag="--m2po-miniclip-high", ge=0, recommended=0.28, why_default=_WHY_FLOORS)
    stat_scope: str = param(
        "local", "local: the statistic per micro-batch on this rank (as the spec); global: over the "
        "micro-batch's tokens on all ranks of the loss's process group (enables context parallel).",
        flag="--m2po-stat-scope", choices=("local", "global"))


def _capabilities(p: M2POParams) -> EstimatorCapabilities:
    return EstimatorCapabilities(
        supports_loss_mask_holes=True,  # verified by the contract kit (with_holes)
        accepts_advantage_terms=True,  # token-level ratio; its harmful-token band reads the final advantages in the loss
        # local: each CP shard would solve its own band; global: the band is solved over
        # all ranks' harmful tokens, the same as one process (tested with 2 gloo ranks).
        supports_context_parallel=p.stat_scope == "global",
        sync_only=False,
        supports_fully_async=True,  # built for stale / reused data
        min_group_size=1,  # raw rewards, no group baseline
        requires_complete_groups=False,
        behaviour_numerator="old_log_probs",
        allows_reward_post_processors=True,
        metrics=METRICS,
    )


@hookimpl
def relax_register_estimators():
    return [EstimatorSpec(
        name="m2po",
        summary="M2PO: raw rewards, PPO-clip whose band is solved so that the second moment of log r over "
                "harmful tokens stays within --m2po-kl2-budget (--eps-clip is not used).",
        source="'Prosperity before Collapse: How Far Can Off-Policy RL Reach with Reuse of Mini-Batch Data?' "
               "(NeurIPS 2025, arXiv 2510.01161), second-moment trust region; Relax's water-filling solver",
        factory="relax_m2po.m2po:build",
        params=M2POParams,
        capabilities=_capabilities,
    )]
