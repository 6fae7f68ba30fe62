"""Hook implementations of relax-score-centering (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import CorrectionCapabilities, CorrectionSpec, SamplingConstraints, hookimpl, param


@dataclass(frozen=True)
class ScoreCenteringParams:
    top_k: int = param(128, "Width k of the sampler's top-k head H (engine top-k log-probs per token).",
                       flag="--score-centering-top-k", ge=1, unit="tokens")


@hookimpl
def relax_register_corrections():
    return [CorrectionSpec(
        name="score_centering",
        summary="Score centering: subtract the sampler's importance-weighted expected score (top-k head + tail model) from REINFORCE.",
        source="Score Centering Stabilizes Off-policy Reinforcement Learning (arXiv:2609.20807) eqs. (9)-(12); spec: SC section",
        factory="relax_score_centering.score_centering:build",
        params=ScoreCenteringParams,
        capabilities=CorrectionCapabilities(
            requires_fields=frozenset({"rollout_log_probs", "top_k_ids", "top_k_log_probs", "train_top_k_log_probs"}),
            behaviour_numerators=frozenset({"log_probs"}),  # a ratio-free (REINFORCE) loss
            sampling=SamplingConstraints(temperature_positive=True, top_p_one=True, top_k_disabled=True,
                                         no_penalties=True),
            order=20,  # after tis / icepop: their weight is on the sampled token already
            supports_context_parallel=True,
            supports_fully_async=True,
            metrics=("train/sc_correction", "train/sc_sampler_head_mass", "train/sc_train_head_mass"),
        ),
    )]
