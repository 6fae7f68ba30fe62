"""Hook implementations of relax-tis (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import BEHAVIOUR_NUMERATORS, CorrectionCapabilities, CorrectionSpec, hookimpl, param


@dataclass(frozen=True)
class TISParams:
    clip_low: float = param(0.0, "Lower bound L of the TIS weight clip(ρ, L, U) (shared with icepop, whose default is 0.5).",
                            flag="--tis-clip-low", ge=0)
    clip: float = param(2.0, "Upper bound U of the TIS weight clip(ρ, L, U) (shared with icepop).",
                        flag="--tis-clip", gt=0)
    level: str = param("token", "Ratio level: token ρ_t, sequence Π_t ρ_t, or geometric (Π_t ρ_t)^(1/n).",
                       flag="--tis-level", choices=("token", "sequence", "geometric"))

    def problems(self) -> list[tuple[str, str]]:
        """Constraints across fields, checked at startup when this component is selected."""
        if self.clip_low > self.clip:
            return [(f"--tis-clip-low {self.clip_low} is above --tis-clip {self.clip}",
                     "choose --tis-clip-low <= --tis-clip")]
        return []


def _capabilities(p: TISParams) -> CorrectionCapabilities:
    token = p.level == "token"
    return CorrectionCapabilities(
        requires_fields=frozenset({"rollout_log_probs"}),
        behaviour_numerators=frozenset(BEHAVIOUR_NUMERATORS),  # ρ with either numerator
        conflicts_with_rollout_logprobs_as_old=True,
        # one importance weight per token: ICE-POP would weight twice; score centering needs
        # a token-level rule for its head weights
        conflicts_with=frozenset({"icepop"} | (set() if token else {"score_centering"})),
        order=10,
        supports_context_parallel=token,  # sequence levels sum log-ratios over the whole sequence
        supports_fully_async=True,
        metrics=("train/tis", "train/tis_clipfrac", "train/tis_abs", "train/ois",
                 "train/train_rollout_logprob_abs_diff"),
    )


@hookimpl
def relax_register_corrections():
    return [CorrectionSpec(
        name="tis",
        summary="Truncated importance sampling: per-token loss × sg(clip(p/q, L, U)) against the rollout engine's q.",
        source="Yao et al. 2025, On the Rollout-Training Mismatch in Modern RL Systems (TIS); spec: TIS section",
        factory="relax_tis.tis:build",
        params=TISParams,
        capabilities=_capabilities,
    )]
