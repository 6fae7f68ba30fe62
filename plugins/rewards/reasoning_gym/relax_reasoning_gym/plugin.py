"""Hook implementations of relax-reasoning-gym (registration only; nothing heavy imported)."""

from relax_core import DataSourceSpec, RewardScorerSpec, hookimpl

_SOURCE = "reasoning-gym (open-thought/reasoning-gym, Apache-2.0): procedural tasks with their own score_answer"


@hookimpl
def relax_register_reward_scorers():
    return [RewardScorerSpec(
        name="reasoning_gym",
        summary="The task's own reasoning-gym score_answer on the final answer (boxed, else <answer>, else the last number).",
        source=_SOURCE,
        factory="relax_reasoning_gym.rg:build_scorer",
    )]


@hookimpl
def relax_register_data_sources():
    return [DataSourceSpec(
        name="rg",
        scheme="rg",
        summary="rg:<dataset>[?size=N&seed=S&<config keys>]: reasoning-gym problems generated offline.",
        source=_SOURCE,
        factory="relax_reasoning_gym.rg:build_source",
    ), DataSourceSpec(
        name="rgc",
        scheme="rgc",
        summary="rgc:<dataset>[?size=N&seed=S&levels=L]: N reasoning-gym problems at each level of the dataset's "
                "curriculum (metadata rg_level; for --sampler curriculum).",
        source=_SOURCE + "; its curricula (reasoning_gym.coaching)",
        factory="relax_reasoning_gym.rg:build_curriculum_source",
    )]
