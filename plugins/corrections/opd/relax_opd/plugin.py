"""Hook implementations of relax-opd (registration only; nothing heavy imported)."""

from dataclasses import dataclass

from relax_core import CorrectionCapabilities, CorrectionSpec, hookimpl, param


@dataclass(frozen=True)
class OPDParams:
    coef: float = param(1.0, "Weight β of the distillation term: A_t ← A_t − β·(log π_old(y_t) − log π_teacher(y_t)).",
                        flag="--opd-coef", gt=0, recommended=1.0,
                        why_default="slime's and the Tinker cookbook's KL coefficient; lower it when the task "
                                    "reward should dominate")


CAPABILITIES = CorrectionCapabilities(
    requires_fields=frozenset({"teacher_log_probs"}),  # the backend's teacher forward (--teacher-model)
    behaviour_numerators=frozenset({"*"}),  # it reads no ratio of the estimator's loss
    advantage_term=True,  # needs an estimator that declares accepts_advantage_terms
    supports_context_parallel=True,  # computed on the whole batch before any sharding
    supports_fully_async=True,  # the student's side is log π_old of the sampled tokens, whatever their age
    metrics=("opd/reverse_kl", "opd/advantage_term_abs_mean"),
)


@hookimpl
def relax_register_corrections():
    return [CorrectionSpec(
        name="opd",
        summary="On-policy distillation: the teacher's per-token reverse KL as a negative advantage term, "
                "A_t − β·(log π_old − log π_teacher) (needs --teacher-model).",
        source="Agarwal et al. 2024, On-Policy Distillation of Language Models (GKD), arXiv 2306.13649; "
               "Gu et al. 2024, MiniLLM, arXiv 2306.08543; Thinking Machines 2025, On-Policy Distillation",
        factory="relax_opd.opd:build",
        params=OPDParams,
        capabilities=CAPABILITIES,
    )]
