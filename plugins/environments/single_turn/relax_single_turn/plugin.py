"""Hook implementations of relax-single-turn (registration only; nothing heavy imported)."""

from relax_core import EnvironmentCapabilities, EnvironmentSpec, hookimpl


@hookimpl
def relax_register_environments():
    return [EnvironmentSpec(
        name="single_turn",
        summary="Prompt -> one completion, scored by the run's scorer: the default, today's behaviour.",
        source="the standard RLVR episode (DeepSeek-AI 2025, DeepSeek-R1, §2.2)",
        factory="relax_single_turn.plugin:build",
        capabilities=EnvironmentCapabilities(),  # one turn: no token continuation, no mask holes
    )]


def build(params, config):
    """``(None, RunConfig) -> relax_core.environments.SingleTurn``."""
    from relax_core.environments import SingleTurn

    return SingleTurn()
