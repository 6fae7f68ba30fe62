"""Hook implementation of relax-curriculum (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import SamplerCapabilities, SamplerSpec, hookimpl, param


@dataclass(frozen=True)
class CurriculumParams:
    threshold: float = param(0.7, "Move up a level when the accuracy of the last --curriculum-window samples of "
                             "the current level reaches this.", gt=0, le=1)
    window: int = param(64, "Samples of the current level whose accuracy decides a move (counted from the last "
                        "move).", unit="samples", ge=1)
    demote_below: float = param(0.0, "Move down a level when that accuracy is below this (0: never move down).",
                                ge=0, le=1)
    pass_threshold: float = param(1.0, "A sample passes when its raw reward (the scorer's, before post-processors) "
                                  "is at least this.")
    start_level: int = param(0, "The level of the first step (the data's lowest is 0).", ge=0)

    def problems(self) -> list[tuple[str, str]]:
        if self.demote_below >= self.threshold:
            return [(f"--curriculum-demote-below {self.demote_below} must be below --curriculum-threshold "
                     f"{self.threshold}: an accuracy could move both up and down",
                     "choose demote-below < threshold (0: never move down)")]
        return []


@hookimpl
def relax_register_samplers():
    return [SamplerSpec(
        name="curriculum",
        summary="Drives a reasoning-gym curriculum (--data rgc:<dataset>): prompts of the current level, one level up "
                "when the recent accuracy passes a threshold; logs the level.",
        source="reasoning-gym's curricula (Stojanovski et al. 2025, 'Reasoning Gym: Reasoning Environments for "
               "Reinforcement Learning with Verifiable Rewards', arXiv 2505.24760); Bengio et al. 2009, "
               "'Curriculum learning'",
        factory="relax_curriculum.sampler:build",
        params=CurriculumParams,
        capabilities=SamplerCapabilities(
            row_metadata="rg_level",
            row_metadata_fix="use --data rgc:<dataset>[?size=N&levels=L], a reasoning-gym task with a curriculum "
                             "(e.g. rgc:chain_sum?size=200&levels=4), or another --sampler"),
    )]
