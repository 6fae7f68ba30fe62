"""The contract test kit: a good toy component passes; each broken variant fails with the
clause it breaks (so the kit's checks can fail)."""

import dataclasses
from dataclasses import dataclass

import pytest

from relax_authoring.testing import check_contract, config_for
from relax_core import (
    CorrectionCapabilities,
    CorrectionSpec,
    EngineSpec,
    EstimatorCapabilities,
    EstimatorSpec,
    RewardScorerSpec,
    param,
)
from relax_core_test_toys import ToyParams

CAPS = EstimatorCapabilities(supports_context_parallel=True, sync_only=False, supports_fully_async=True,
                             min_group_size=2, behaviour_numerator="old_log_probs")


def toy(factory="build_toy_reinforce", caps=CAPS, **kw):
    fields = {"name": "toy", "summary": "toy estimator", "source": "tests", "params": ToyParams,
              "factory": f"relax_core_test_toys:{factory}", "capabilities": caps}
    return EstimatorSpec(**{**fields, **kw})


def failures(spec, *args, **kw):
    with pytest.raises(AssertionError) as e:
        check_contract(spec, *args, **kw)
    return str(e.value)


def test_good_estimator_passes_including_two_ranks():
    check_contract(toy())
    check_contract(toy(), ToyParams(beta=0.25, mode="b"))


def test_pytest_fixture(relax_contract):
    relax_contract(toy())
    with pytest.raises(AssertionError, match="contract check"):
        relax_contract(toy("build_nan_leak"))


def test_masked_garbage_reaching_the_gradient_is_caught():
    msg = failures(toy("build_nan_leak"), distributed=False)
    assert msg == ("estimator 'toy': 2 contract check(s) failed:\n"
                   "  - policy_loss: gradient w.r.t. log_probs is not finite everywhere\n"
                   "  - policy_loss with bfloat16 inputs: gradient w.r.t. log_probs is not finite everywhere")


def test_token_metric_garbage_at_masked_positions_is_caught():
    # the core reduces token metrics as sum(mask * x): NaN left in a masked slot would make the logged mean NaN
    msg = failures(toy("build_metric_garbage"), distributed=False)
    assert "policy_loss: token_metrics['ppo_kl'] is not finite at" in msg and "masked position(s)" in msg


def test_false_context_parallel_claim_is_caught():
    msg = failures(toy("build_seq_ratio_local"))
    assert "1 contract check(s) failed" in msg
    assert "supports_context_parallel: same loss and gradient over 2 ranks: loss summed over 2 ranks" in msg
    # without the claim, the same estimator passes
    check_contract(toy("build_seq_ratio_local", caps=dataclasses.replace(CAPS, supports_context_parallel=False)))


def test_output_contract_violations_are_caught():
    assert "advantages are not 0 at masked positions" in failures(toy("build_adv_at_masked"), distributed=False)
    assert "loss has shape (12,), expected (12, 8)" in failures(toy("build_wrong_shape"), distributed=False)


def test_sync_only_and_contradictions():
    sync = dataclasses.replace(CAPS, sync_only=True, supports_fully_async=False)
    check_contract(toy(caps=sync), distributed=False)  # refused in async mode, as declared
    msg = failures(toy(caps=dataclasses.replace(CAPS, sync_only=True)), distributed=False)
    assert "declares supports_fully_async but is refused in async mode" in msg
    msg = failures(toy(caps=dataclasses.replace(CAPS, requires_per_token_loss=True, forbids_per_token_loss=True)),
                   distributed=False)
    assert "validator accepts a config meeting the declared requirements: [forbids_per_token_loss]" in msg


def test_capabilities_must_be_declared_and_typed():
    assert "behaviour_numerator must be one of old_log_probs, log_probs, got None" in failures(toy(caps=None), distributed=False)
    assert "must return a EstimatorCapabilities, got CorrectionCapabilities" in failures(
        toy(caps=lambda p: CorrectionCapabilities()), distributed=False)


def test_the_kit_config_meets_declared_requirements():
    caps = dataclasses.replace(CAPS, requires_per_token_loss=True, requires_kl_loss=True, min_group_size=6,
                               requires_normalize_advantages=True)
    cfg = config_for(toy(caps=caps))
    assert (cfg.calculate_per_token_loss, cfg.use_kl_loss, cfg.n_samples_per_prompt, cfg.normalize_advantages) == \
        (True, True, 6, True)
    check_contract(toy(caps=caps), distributed=False)


def test_spec_problems_are_all_listed():
    @dataclass
    class Loose:  # not frozen, a field without help, a default out of bounds
        a: float = 1.0
        b: float = param(-1.0, "must be >= 0", ge=0)

    spec = toy(name="Toy", summary="two\nlines", source="", factory="relax_core_test_toys:no_such", params=Loose)
    msg = failures(spec, distributed=False)
    for text in ("name: 'Toy' must match", "summary: summary must be one line", "source: empty source",
                 "factory resolves: raised AttributeError", "params schema: params dataclass must be frozen",
                 "the loader's spec checks: component name 'Toy' must match"):
        assert text in msg, text

    @dataclass(frozen=True)
    class Frozen:
        a: float = dataclasses.field(default=1.0)
        b: float = param(-1.0, "must be >= 0", ge=0)
        c: int = param(1, "flag style", flag="--Bad_Flag")

    msg = failures(toy(params=Frozen), distributed=False)
    assert "param a: no help text (declare it with relax_core.param)" in msg
    assert "param b: default outside its declared bounds: --toy-b must be >= 0, got -1.0" in msg
    assert "param c: flag '--Bad_Flag' must look like --lower-case-words" in msg
    assert "params given: --toy-beta must be <= 1, got 3.0" in failures(toy(), ToyParams(beta=3.0), distributed=False)


def _correction(factory, caps=None):
    caps = caps or CorrectionCapabilities(requires_fields=frozenset({"rollout_log_probs"}), behaviour_numerators=frozenset({"*"}))
    return CorrectionSpec(name="toy_tis", summary="toy", source="tests", factory=f"relax_core_test_toys:{factory}",
                          capabilities=caps)


def test_corrections():
    check_contract(_correction("build_correction"))
    msg = failures(_correction("build_leaky_correction"))
    assert "importance weights carry no gradient: the corrected loss has a gradient w.r.t. log_probs" in msg
    assert "accepts no behaviour numerator" in failures(_correction("build_correction",
                                                                            CorrectionCapabilities()))
    cp = CorrectionCapabilities(behaviour_numerators=frozenset({"*"}), supports_context_parallel=True)
    check_contract(_correction("build_correction", cp))
    msg = failures(_correction("build_sequence_correction", cp))
    assert msg.startswith("correction 'toy_tis': 1 contract check(s) failed:\n  - supports_context_parallel: "
                          "same loss and gradient over 2 sequence pieces: corrected loss summed over the 2 pieces")


def test_reward_scorers():
    spec = RewardScorerSpec(name="toy_reward", summary="toy", source="tests", factory="relax_core_test_toys:build_scorer")
    check_contract(spec)
    msg = failures(dataclasses.replace(spec, factory="relax_core_test_toys:build_bad_scorer"))
    assert "score('The answer is 42.', '42'): returned 'yes'; expected a finite float or None" in msg
    assert "score('', '1'): returned nan" in msg


def test_engines_get_spec_checks_only():
    check_contract(EngineSpec(name="toy_engine", summary="toy", source="tests", factory="relax_core_test_toys:build_scorer"))
    assert "factory resolves" in failures(EngineSpec(name="e", summary="s", source="s", factory="nope.nope:x"))
