"""Hook implementations of relax-routing-replay (registration only; nothing heavy imported)."""

from relax_core import CorrectionCapabilities, CorrectionSpec, hookimpl


@hookimpl
def relax_register_corrections():
    return [CorrectionSpec(
        name="routing_replay",
        summary="R3: the training forward replays the MoE experts the rollout engine chose for every token and layer.",
        source="Ma et al. 2025, Stabilizing MoE Reinforcement Learning by Aligning Training and Inference Routers "
               "(arXiv:2510.11370); spec: R3 section",
        factory="relax_routing_replay.routing_replay:build",
        capabilities=CorrectionCapabilities(
            needs_moe_model=True,
            requires_fields=frozenset({"routed_experts"}),
            needs_routing_replay=True,
            behaviour_numerators=frozenset({"*"}),
            order=0,
            supports_context_parallel=True,
            supports_fully_async=True,
        ),
    )]
