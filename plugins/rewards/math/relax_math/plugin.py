"""Hook implementations of relax-math (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import DataSourceSpec, RewardScorerSpec, hookimpl, param

_GSM8K = "Cobbe et al. 2021, Training Verifiers to Solve Math Word Problems (GSM8K)"


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
            fixes=("--math-answer-format anchors (also 'Answer: X' lines and <answer> tags)",),
        ),
        RewardScorerSpec(
            name="gsm8k",
            summary="1 if the response's final number (or boxed answer) equals the GSM8K label's '#### N', else 0.",
            source=_GSM8K,
            factory="relax_math.scorers:build_gsm8k",
            auto_labels="relax_math.gsm8k:is_number",
            suggest="--reward gsm8k (the final number, or the last \\boxed{}) for numeric labels",
        ),
    ]


@hookimpl
def relax_register_data_sources():
    return [DataSourceSpec(
        name="gsm8k",
        scheme="gsm8k",
        summary="gsm8k:<file>: a GSM8K JSONL/JSON/Parquet file (question, answer ending in '#### N'); "
                "a bare file path with those keys is read as GSM8K too.",
        source=_GSM8K,
        factory="relax_math.gsm8k:build_source",
        file_keys=("question", "answer"),
    )]
