"""Hook implementations of relax-ppo (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import DualClipParams, EstimatorCapabilities, EstimatorSpec, hookimpl, param


@dataclass(frozen=True)
class PPOParams(DualClipParams):
    gamma: float = param(1.0, "GAE discount factor γ.", flag="--gamma", ge=0, le=1)
    lambd: float = param(1.0, "GAE λ (bias/variance trade-off of the advantage).", flag="--lambd", ge=0, le=1)
    value_clip: float = param(
        0.2, "Critic value clip: v_clip = v_old + clamp(v - v_old, -c, c); loss max((v_clip - R)², (v - R)²).",
        flag="--value-clip", ge=0)
    num_critic_only_steps: int = param(
        0, "First steps that train only the critic (the actor is not updated).",
        flag="--num-critic-only-steps", unit="steps", ge=0)
    critic_lr: float | None = param(None, "Critic learning rate (default: --lr).", flag="--critic-lr", gt=0)
    critic_load: str | None = param(
        None, "Initial critic weights (a model directory); default: a copy of --model with a fresh value head.",
        flag="--critic-load")


CAPABILITIES = EstimatorCapabilities(
    supports_loss_mask_holes=True,  # verified by the contract kit (with_holes)
    accepts_advantage_terms=True,  # PPO-clip per token; the term is not in the critic's returns (no bootstrapping: γ = 0 for it, as slime and the Tinker cookbook)
    supports_context_parallel=True,  # GAE runs on whole sequences; both losses are token-local
    sync_only=True,
    supports_fully_async=False,
    needs_critic=True,
    min_group_size=1,
    requires_complete_groups=False,
    behaviour_numerator="old_log_probs",
    allows_reward_post_processors=True,
    metrics=("train/value_loss", "train/value_clipfrac"),
)


@hookimpl
def relax_register_estimators():
    return [EstimatorSpec(
        name="ppo",
        summary="Proximal Policy Optimization with a critic: GAE advantages, PPO-clip, clipped value loss.",
        source="Schulman et al. 2017, PPO, eq. (7); GAE: Schulman et al. 2016, eq. (16)",
        factory="relax_ppo.ppo:build",
        params=PPOParams,
        capabilities=CAPABILITIES,
    )]
