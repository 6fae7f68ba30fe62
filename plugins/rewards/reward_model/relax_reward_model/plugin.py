"""Hook implementation of relax-reward-model (registration only; nothing heavy imported)."""

from dataclasses import dataclass
from pathlib import Path

from relax_core import RewardScorerSpec, hookimpl, param


@dataclass(frozen=True)
class RewardModelParams:
    path: str | None = param(None, "Local Hugging Face directory of a sequence-classification reward model with one "
                             "output (num_labels 1) and its tokenizer.")
    batch_size: int = param(16, "Samples per forward pass.", unit="samples", ge=1)
    max_length: int = param(2048, "Tokens of prompt + response scored; longer texts lose their beginning (the "
                            "response's end is kept).", unit="tokens", ge=8)
    device: str = param("cpu", "Device of the reward model (each reward worker loads its own copy; under "
                        "--launcher ray the workers run in the scorer's own Ray actor, with one GPU for cuda).",
                        choices=("cpu", "cuda"))
    normalize: str = param("none", "Score normalisation: none (the model's logit) or sigmoid (in (0, 1)).",
                           choices=("none", "sigmoid"))

    def problems(self) -> list[tuple[str, str]]:
        if self.path is None:
            return [("needs --reward-model-path", "give the local directory of an AutoModelForSequenceClassification "
                                                  "model (config.json, weights and tokenizer)")]
        if not (Path(self.path).expanduser() / "config.json").is_file():
            return [(f"--reward-model-path {self.path} holds no config.json",
                     "give a local Hugging Face model directory (downloads are not made)")]
        return []


def actor_gpus(p: RewardModelParams) -> float:
    """The GPUs of its Ray actor under --launcher ray: one on cuda, none on cpu."""
    return 1.0 if p.device == "cuda" else 0.0


@hookimpl
def relax_register_reward_scorers():
    return [RewardScorerSpec(
        name="reward_model",
        summary="A local sequence-classification reward model scores prompt + response, a batch per call.",
        source="Ouyang et al. 2022, 'Training language models to follow instructions with human feedback', §3.5 "
               "(reward model: a scalar head on the prompt and response)",
        factory="relax_reward_model.scorer:build",
        params=RewardModelParams,
        batched=True,
        self_check=False,  # a learned score has no 'correct label' to check
        model_based=True,
        ray_num_gpus=actor_gpus,
    )]
