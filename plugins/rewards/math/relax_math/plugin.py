"""Hook implementations of relax-math (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import RewardScorerSpec, hookimpl, param


@dataclass(frozen=True)
class MathParams:
    answer_format: str = param(
        "boxed",
        "Where the final answer may be: 'boxed' (only the last \\boxed{}/\\fbox{}; strict) or "
        "'anchors' (also <answer>...</answer>, an 'Answer:' line or '#### N', when no box).",
        flag="--math-answer-format", choices=("boxed", "anchors"))


@hookimpl
def relax_register_reward_scorers():
    return [
        RewardScorerSpec(
            name="math",
            summary="1 if the final answer (last \\boxed{}) is mathematically equivalent to the label (math-verify), else 0.",
            source="math-verify (Hugging Face); boxed-answer convention of Hendrycks et al. 2021, MATH",
            factory="relax_math.scorers:build_math",
            params=MathParams,
        ),
        RewardScorerSpec(
            name="gsm8k",
            summary="1 if the response's final number (or boxed answer) equals the GSM8K label's '#### N', else 0.",
            source="Cobbe et al. 2021, Training Verifiers to Solve Math Word Problems (GSM8K)",
            factory="relax_math.scorers:build_gsm8k",
        ),
    ]
