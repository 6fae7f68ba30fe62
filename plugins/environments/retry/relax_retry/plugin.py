"""Hook implementations of relax-retry (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import EnvironmentCapabilities, EnvironmentSpec, hookimpl, param


@dataclass(frozen=True)
class RetryParams:
    attempts: int = param(3, "Attempts per episode (the episode also ends at --max-turns).", ge=1)
    discount: float = param(1.0, "Reward of a correct answer at attempt k (from 0): score × discount^k.",
                            ge=0.0, le=1.0)
    correct: float = param(1.0, "A turn whose score reaches this is correct (ends the episode).")
    feedback: str = param("Your answer is not correct, try again.", "The reply to a wrong answer.")


@hookimpl
def relax_register_environments():
    return [EnvironmentSpec(
        name="retry",
        summary="A wrong answer gets feedback and another attempt; a correct one ends the episode, its reward "
                "discounted by attempt.",
        source="multi-attempt RL with feedback (Kumar et al. 2024, 'Training Language Models to Self-Correct via "
               "Reinforcement Learning', SCoRe, §3)",
        factory="relax_retry.retry:build",
        params=RetryParams,
        capabilities=EnvironmentCapabilities(multi_turn=True, scores_turns=True),
    )]
