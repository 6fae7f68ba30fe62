"""Hook implementation of relax-difficulty (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import SamplerCapabilities, SamplerSpec, hookimpl, param


@dataclass(frozen=True)
class DifficultyParams:
    window: int = param(16, "Outcomes kept per prompt (its most recent samples) for its pass rate.",
                        unit="samples", ge=1)
    min_pass_rate: float = param(0.0, "Too hard: a prompt whose pass rate is at or below this is drawn with the "
                                 "exploration weight.", ge=0, le=1)
    max_pass_rate: float = param(1.0, "Too easy: a prompt whose pass rate is at or above this is drawn with the "
                                 "exploration weight.", ge=0, le=1)
    explore_floor: float = param(0.05, "Weight of a too-easy or too-hard prompt, relative to 1 for a prompt in the "
                                 "band or never seen (> 0: every prompt keeps a chance).", gt=0, le=1)
    pass_threshold: float = param(1.0, "A sample passes when its raw reward (the scorer's, before post-processors) is "
                                  "at least this.")

    def problems(self) -> list[tuple[str, str]]:
        if self.min_pass_rate >= self.max_pass_rate:
            return [(f"--difficulty-min-pass-rate {self.min_pass_rate} must be below --difficulty-max-pass-rate "
                     f"{self.max_pass_rate}: no pass rate would be in the band",
                     "choose bounds with min < max (the defaults 0 and 1: prompts solved sometimes but not always)")]
        return []


@hookimpl
def relax_register_samplers():
    return [SamplerSpec(
        name="difficulty",
        summary="Draws prompts whose recent pass rate is strictly between two bounds (too easy and too hard ones "
                "with an exploration weight); logs the pass-rate histogram.",
        source="Bae et al. 2025, 'Online Difficulty Filtering for Reasoning Oriented Reinforcement Learning' "
               "(arXiv 2504.03380); DAPO dynamic sampling (Yu et al. 2025, §3.2) applied before generation",
        factory="relax_difficulty.sampler:build",
        params=DifficultyParams,
        capabilities=SamplerCapabilities(needs_stable_prompt_ids=True),
    )]
