"""Hook implementations of relax-icepop (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import BEHAVIOUR_NUMERATORS, CorrectionCapabilities, CorrectionSpec, hookimpl, param


@dataclass(frozen=True)
class IcePopParams:
    clip_low: float = param(0.5, "Lower edge L of the kept band L <= ρ <= U (shared flag with tis, whose default is 0).",
                            flag="--tis-clip-low", ge=0)
    clip: float = param(2.0, "Upper edge U of the kept band L <= ρ <= U (shared flag with tis).",
                        flag="--tis-clip", gt=0)

    def problems(self) -> list[tuple[str, str]]:
        """Constraints across fields, checked at startup when this component is selected."""
        if self.clip_low > self.clip:
            return [(f"--tis-clip-low {self.clip_low} is above --tis-clip {self.clip}",
                     "choose --tis-clip-low <= --tis-clip")]
        return []


@hookimpl
def relax_register_corrections():
    return [CorrectionSpec(
        name="icepop",
        summary="ICE-POP: per-token loss × sg(ρ·1[L ≤ ρ ≤ U]); tokens outside the band are dropped, not renormalised.",
        source="Ling Team 2025, Every Step Evolves (arXiv:2510.18855), IcePop; spec: ICE-POP section",
        factory="relax_icepop.icepop:build",
        params=IcePopParams,
        capabilities=CorrectionCapabilities(
            requires_fields=frozenset({"rollout_log_probs"}),
            behaviour_numerators=frozenset(BEHAVIOUR_NUMERATORS),  # ρ with either numerator
            conflicts_with_rollout_logprobs_as_old=True,
            conflicts_with=frozenset({"tis"}),
            order=10,
            supports_context_parallel=True,
            supports_fully_async=True,
            metrics=("train/tis", "train/tis_clipfrac", "train/tis_abs", "train/ois",
                     "train/train_rollout_logprob_abs_diff"),
        ),
    )]
