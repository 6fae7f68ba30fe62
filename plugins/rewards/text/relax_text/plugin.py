"""Hook implementations of relax-text (registration only; nothing heavy imported)."""

from relax_core import RewardScorerSpec, hookimpl


@hookimpl
def relax_register_reward_scorers():
    return [
        RewardScorerSpec(
            name="multiple_choice",
            summary="1 if the chosen letter (\\boxed{}, <answer>, 'Answer: X' or a lone letter) is the label's, else 0.",
            source="Letter-answer convention of MMLU (Hendrycks et al. 2021) and GPQA (Rein et al. 2023)",
            factory="relax_text.scorers:build_multiple_choice",
        ),
        RewardScorerSpec(
            name="f1",
            summary="Token F1 between the answer and the label (SQuAD normalisation; best over several labels).",
            source="Rajpurkar et al. 2016, SQuAD, §5 (token-overlap F1); yes/no rule of HotpotQA (Yang et al. 2018)",
            factory="relax_text.scorers:build_f1",
        ),
    ]
