"""Throwaway plugins and toy components for the core's tests (no entry points).

Imported by module name (``tests/core/conftest.py`` puts this folder on ``sys.path``) so
that toy factories resolve by dotted path, as a real plugin's do.
"""

from __future__ import annotations

import types
import urllib.parse
from dataclasses import dataclass

import torch

from relax_core import (
    BackendCapabilities,
    BackendSpec,
    DataSourceSpec,
    EngineCapabilities,
    EngineSpec,
    EnvironmentSpec,
    EstimatorCapabilities,
    EstimatorSpec,
    RewardScorerSpec,
    SamplerSpec,
    hookimpl,
    param,
)
from relax_core.contracts import AdvantageOutput, CorrectionOutput, PolicyLossOutput
from relax_core.hookspecs import HOOK_KINDS
from relax_core.numerics import broadcast_to_tokens, group_stats, masked_fill_zero

_KIND_HOOK = {kind: hook for hook, kind in HOOK_KINDS.items()}


def make_plugin(*specs, **raw_hooks) -> types.SimpleNamespace:
    """A plugin object registering ``specs`` (each under its kind's hook), plus any
    extra ``hook_name=function`` attributes (to test misspelled or undecorated hooks)."""
    by_hook: dict[str, list] = {}
    for s in specs:
        by_hook.setdefault(_KIND_HOOK[s.kind], []).append(s)
    ns = types.SimpleNamespace(**raw_hooks)
    for hook, lst in by_hook.items():
        setattr(ns, hook, hookimpl(lambda lst=tuple(lst): list(lst)))
    return ns


@dataclass(frozen=True)
class ToyParams:
    beta: float = param(0.5, "A toy coefficient.", ge=0, le=1)
    mode: str = param("a", "A toy mode.", choices=("a", "b"))


def estimator(name="toy", caps=None, **kw) -> EstimatorSpec:
    return EstimatorSpec(name=name, summary="toy estimator", source="tests",
                         factory=kw.pop("factory", "relax_core_test_toys:build_estimator"),
                         params=kw.pop("params", ToyParams), capabilities=caps, **kw)


BASE_CAPS = EstimatorCapabilities(sync_only=False, supports_fully_async=True, behaviour_numerator="old_log_probs",
                                  min_group_size=2)


def infra_plugin() -> types.SimpleNamespace:
    """The engine 'hf', backend 'torch', sampler 'uniform', environment 'single_turn', data source
    'rg:' and scorer 'math' a default config selects (the data source and scorer work: a dry run
    reads the data and builds the scorer)."""
    return make_plugin(
        DataSourceSpec(name="rg", scheme="rg", summary="toy data source", source="tests",
                       factory="relax_core_test_toys:build_rows"),
        RewardScorerSpec(name="math", summary="toy scorer", source="tests", factory="relax_core_test_toys:build_scorer"),
        EngineSpec(name="hf", summary="toy engine", source="tests", factory="x:y",
                   capabilities=EngineCapabilities(provides_fields=frozenset({"rollout_log_probs"}), supports_weight_update=True)),
        BackendSpec(name="torch", summary="toy backend", source="tests", factory="x:y",
                    capabilities=BackendCapabilities(supports_data_parallel=True, supports_critic=True)),
        SamplerSpec(name="uniform", summary="toy sampler", source="tests", factory="x:y"),
        EnvironmentSpec(name="single_turn", summary="toy single turn", source="tests",
                        factory="relax_core.environments:SingleTurn"),
    )


def build_rows(params, config):
    """Four rows from the spec's ``seed`` on, so that the default data and its evaluation
    data (seeds 42 and 7) share no prompt, as the real generator's do once the training
    rows leave out the evaluation prompts."""
    def rows(spec, cfg):
        seed = int(dict(urllib.parse.parse_qsl(spec.partition("?")[2])).get("seed", 0))
        return [{"prompt": f"{i} + 1 = ?", "label": str(i + 1), "metadata": {}} for i in range(seed, seed + 4)]
    return rows


def build_qa_format(params, config):
    """A toy file format (``file_keys=("q", "sol")``): ``{"q", "sol": "... = N"}`` → the row
    ``{"prompt": q, "label": N}``; a record whose ``sol`` has no ``=`` is bad."""
    def row(record):
        if "=" not in str(record["sol"]):
            raise ValueError("sol has no '= N'")
        return {"prompt": record["q"], "label": record["sol"].rsplit("=", 1)[1].strip(), "metadata": {"source": "qa"}}
    return row


def is_even_label(label) -> bool:
    """A toy scorer's ``auto_labels``: an even integer label."""
    return str(label).lstrip("-").isdigit() and int(label) % 2 == 0


def qa_plugin(**scorer_kw):
    """A toy plugin with the file format ``qa:`` and scorers ``even`` (claiming even integer
    labels, with ``scorer_kw``) and ``zeven`` (claiming them too: ``even`` wins by name)."""
    return ("qa", make_plugin(
        DataSourceSpec(name="qa", scheme="qa", summary="toy file format", source="tests",
                       factory="relax_core_test_toys:build_qa_format", file_keys=("q", "sol")),
        RewardScorerSpec(name="even", summary="toy", source="tests", factory="relax_core_test_toys:build_scorer",
                         **{"auto_labels": "relax_core_test_toys:is_even_label", **scorer_kw}),
        RewardScorerSpec(name="zeven", summary="toy", source="tests", factory="relax_core_test_toys:build_scorer",
                         auto_labels="relax_core_test_toys:is_even_label")), "relax-qa", "1.0")


def build_estimator(params, config):
    return ("toy", params, config)


# --------------------------------------------------------------------------- toy estimators for the kit
# Vectorised; each "bad" variant breaks exactly one clause of the contract.


class ToyReinforce:
    """A = R − group mean (unscored: 0); loss = −A·r with r = exp(log π − log π_old)."""

    def __init__(self, variant: str = "good"):
        self.variant = variant

    def compute_advantages(self, inp):
        stats = group_stats(inp.rewards, inp.group_index)
        adv = torch.where(torch.isfinite(inp.rewards), inp.rewards - stats["mean"], 0.0)  # [B]
        out = broadcast_to_tokens(adv, inp.loss_mask)
        if self.variant == "adv_at_masked":
            out = adv[:, None].expand(inp.loss_mask.shape).float()
        if self.variant == "length_adv":  # broadcast over the first response_lengths positions, not loss_mask
            from relax_core.batch import length_mask

            out = broadcast_to_tokens(adv, length_mask(inp.response_lengths, inp.loss_mask.shape[1]))
        return AdvantageOutput(advantages=out, returns=out.clone(), metrics={"rollout/toy_adv_mean": float(adv.mean())})

    def policy_loss(self, inp):
        mask = inp.loss_mask.bool()
        adv = masked_fill_zero(inp.advantages, mask)
        if self.variant == "seq_adv":  # the sequence's mean advantage at every token (GSPO-like credit)
            n = mask.sum(-1, keepdim=True).clamp(min=1)
            adv = masked_fill_zero((adv.sum(-1, keepdim=True) / n).expand(mask.shape), mask)
        if self.variant == "nan_leak":  # no masking before exp: NaN reaches the gradient
            log_ratio = inp.log_probs - inp.old_log_probs
        else:
            log_ratio = masked_fill_zero(inp.log_probs - inp.old_log_probs, mask)
        if self.variant == "seq_ratio_local":  # a per-sequence mean over this rank's tokens only
            n = mask.sum(-1, keepdim=True).clamp(min=1)
            log_ratio = (log_ratio.sum(-1, keepdim=True) / n).expand(mask.shape)
        ratio = torch.exp(log_ratio)
        loss = -adv * ratio
        if self.variant == "wrong_shape":
            loss = loss.sum(-1)
        kl = masked_fill_zero(-log_ratio.detach(), mask)  # [B, T]
        if self.variant == "metric_garbage":  # the metric from the raw inputs: NaN left at masked positions
            kl = (inp.old_log_probs - inp.log_probs).detach()
        return PolicyLossOutput(loss=loss, token_metrics={"ppo_kl": kl})


def build_toy_reinforce(params, config):
    return ToyReinforce("good")


def build_nan_leak(params, config):
    return ToyReinforce("nan_leak")


def build_metric_garbage(params, config):
    return ToyReinforce("metric_garbage")


def build_seq_ratio_local(params, config):
    return ToyReinforce("seq_ratio_local")


def build_seq_adv(params, config):
    return ToyReinforce("seq_adv")


def build_length_adv(params, config):
    return ToyReinforce("length_adv")


def build_adv_at_masked(params, config):
    return ToyReinforce("adv_at_masked")


def build_wrong_shape(params, config):
    return ToyReinforce("wrong_shape")


class ToyCorrection:
    """Truncated importance weight min(π_old/q, 2), detached unless ``leaky``; with
    ``sequence`` the weight is the product over the (local) tokens of the sequence."""

    def __init__(self, leaky: bool, sequence: bool = False):
        self.leaky, self.sequence = leaky, sequence

    def apply(self, inp):
        mask = inp.loss_mask.bool()
        log_w = masked_fill_zero(inp.old_log_probs - inp.rollout_log_probs, mask)
        if self.sequence:
            log_w = log_w.sum(-1, keepdim=True).expand(mask.shape)
        if self.leaky:
            log_w = log_w + masked_fill_zero(inp.log_probs - inp.log_probs.detach(), mask)
        w = torch.exp(log_w).clamp(max=2.0)
        if not self.leaky:
            w = w.detach()
        return CorrectionOutput(loss=masked_fill_zero(inp.loss, mask) * w, token_metrics={"toy_w": w.detach()})


def build_correction(params, config):
    return ToyCorrection(leaky=False)


def build_leaky_correction(params, config):
    return ToyCorrection(leaky=True)


def build_sequence_correction(params, config):
    return ToyCorrection(leaky=False, sequence=True)


def build_scorer(params, config):
    return lambda response, label, metadata: 1.0 if label in response else 0.0


def build_bad_scorer(params, config):
    return lambda response, label, metadata: float("nan") if not response else "yes"
