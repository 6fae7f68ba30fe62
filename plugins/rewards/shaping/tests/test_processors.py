"""Reward post-processors: DAPO values, NaN handling, groups by id, order, registration."""

import math

import pytest
import torch

from relax_core.config import RunConfig
from relax_core.contracts import RewardBatch
from relax_core.stages.rewarding import apply_processors
from relax_reward_shaping.plugin import (
    ClipParams,
    FormatParams,
    LengthPenaltyParams,
    OverlongParams,
    ZeroVarianceParams,
    relax_register_reward_processors,
)
from relax_reward_shaping.processors import (
    Clip,
    FormatReward,
    LengthPenalty,
    OverlongPenalty,
    ZeroVarianceFilter,
    build_overlong,
)

NAN = float("nan")


def batch(rewards, lengths=None, groups=None, responses=None, dtype=torch.float32, keep=None):
    n = len(rewards)
    return RewardBatch(
        rewards=torch.tensor(rewards, dtype=dtype),
        group_index=torch.tensor(groups if groups is not None else [0] * n),
        response_lengths=torch.tensor(lengths if lengths is not None else [1] * n),
        truncated=torch.zeros(n, dtype=torch.bool),
        responses=responses if responses is not None else [""] * n,
        keep=torch.tensor(keep) if keep is not None else torch.ones(n, dtype=torch.bool))


def as_list(t):
    return [None if math.isnan(v) else v for v in t.tolist()]


def test_overlong_penalty_dapo_values():
    p = OverlongPenalty(max_len=20, buffer_len=4)
    assert p.penalty(torch.tensor([0, 16, 17, 18, 20, 21, 25])).tolist() == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0]
    out = p.process(batch([1.0, 1.0, 0.0, 1.0, NAN], lengths=[16, 18, 20, 25, 25]))
    assert as_list(out.rewards) == [1.0, 0.5, -1.0, 0.0, None]
    assert out.metrics["rollout/overlong_penalized_frac"] == pytest.approx(4 / 5)
    assert out.metrics["rollout/overlong_penalty_mean"] == pytest.approx((0 - 0.5 - 1 - 1 - 1) / 5)
    # the factor scales the full penalty
    assert OverlongPenalty(20, 4, penalty_factor=0.5).penalty(torch.tensor([18, 25])).tolist() == [-0.25, -0.5]


def test_overlong_defaults_from_the_run_config():
    p = build_overlong(OverlongParams(), RunConfig(rollout_max_response_len=20))
    assert (p.max_len, p.buffer_len) == (20, 4)
    p = build_overlong(OverlongParams(max_len=10, buffer_len=2), None)
    assert p.penalty(torch.tensor([8, 9, 10])).tolist() == [0.0, -0.5, -1.0]
    with pytest.raises(ValueError, match="must be in"):
        OverlongPenalty(max_len=4, buffer_len=5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_processors_keep_dtype_and_nan(dtype):
    b = batch([1.0, NAN, 0.5], lengths=[16, 25, 30], responses=["\\boxed{1}", "x", "y"], dtype=dtype)
    for proc in (OverlongPenalty(20, 4), FormatReward(r"\\boxed\{.+\}"), LengthPenalty(0.01), Clip(-1, 1)):
        out = proc.process(b)
        assert out.rewards.dtype == dtype and out.rewards.shape == (3,)
        assert math.isnan(out.rewards[1].item()), type(proc).__name__


def test_format_bonus_and_penalty():
    out = FormatReward(r"\\boxed\{.+\}", bonus=0.25, penalty=-0.5).process(
        batch([1.0, 1.0, 0.0], responses=["so \\boxed{4}", "so 4", "\\boxed{"]))
    assert out.rewards.tolist() == [1.25, 0.5, -0.5]
    assert out.metrics["rollout/format_match_frac"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="not a valid regular expression"):
        FormatReward("(")


def test_length_penalty_per_token():
    out = LengthPenalty(0.125).process(batch([1.0, 0.0], lengths=[8, 0]))
    assert out.rewards.tolist() == [0.0, 0.0]
    assert out.metrics["rollout/length_penalty_mean"] == 0.5


def test_clip():
    out = Clip(-1.0, 1.0).process(batch([-3.0, -1.0, 0.2, 1.0, 5.0, NAN]))
    assert as_list(out.rewards)[:5] == pytest.approx([-1.0, -1.0, 0.2, 1.0, 1.0]) and as_list(out.rewards)[5] is None
    assert out.metrics["rollout/reward_clip_frac"] == pytest.approx(2 / 6)
    with pytest.raises(ValueError, match="must be <="):
        Clip(1.0, -1.0)


def test_zero_variance_filter_groups_by_id_not_position():
    # groups 7, 3, 9 interleaved: 7 = {1, 1} (all equal), 3 = {0, 1}, 9 = {0, 0}
    b = batch([1.0, 0.0, 0.0, 1.0, 0.0, 1.0], groups=[7, 3, 9, 7, 9, 3])
    out = ZeroVarianceFilter().process(b)
    assert out.keep.tolist() == [False, True, False, False, False, True]
    assert out.metrics["rollout/filtered_group_frac"] == pytest.approx(2 / 3)
    assert torch.equal(out.rewards, b.rewards)  # rewards untouched


def test_zero_variance_filter_unscored_and_existing_keep():
    # g0: {1, NaN} one scored -> dropped; g1: {1, 0, NaN} -> kept; g2: all NaN -> dropped
    # g3: {0.5, 0.5 + 1e-7} within eps -> dropped; g4: {0, 1} kept but sample 10 already dropped
    b = batch([1.0, NAN, 1.0, 0.0, NAN, NAN, NAN, 0.5, 0.5 + 1e-7, 0.0, 1.0],
              groups=[0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 4],
              keep=[True] * 10 + [False])
    out = ZeroVarianceFilter(eps=1e-6).process(b)
    assert out.keep.tolist() == [False, False, True, True, True, False, False, False, False, True, False]
    assert out.metrics["rollout/filtered_group_frac"] == pytest.approx(3 / 5)
    assert ZeroVarianceFilter(eps=0.0).process(b).keep[7:9].tolist() == [True, True]


def test_zero_variance_filter_tests_the_raw_reward_in_any_position():
    """NeMo-RL #2431: after an overlong penalty (L_max 20, L_cache 4) an all-wrong group of
    mixed lengths has shaped rewards 0 - 0 = 0 and 0 - 0.75 = -0.75 (length 19): a filter of
    the shaped reward keeps it; the raw rewards (0, 0) carry no signal and it is dropped.
    Group 5: raw 1 and 0 at lengths 10 and 19 is kept (shaped 1 and -0.75)."""
    over, zv = OverlongPenalty(20, 4), ZeroVarianceFilter()
    b = batch([0.0, 0.0, 1.0, 0.0], lengths=[10, 19, 10, 19], groups=[4, 4, 5, 5])
    for order in ([over, zv], [zv, over]):
        out = apply_processors(order, b)
        assert out.keep.tolist() == [False, False, True, True]
        assert out.rewards.tolist() == [0.0, -0.75, 1.0, -0.75] and out.raw_rewards.tolist() == [0.0, 0.0, 1.0, 0.0]
        assert out.metrics["rollout/filtered_group_frac"] == 0.5
    shaped = apply_processors([over], b).rewards  # what the filter saw before the fix: group 4 has spread 0.75
    assert zv.zero_variance_groups(shaped, b.group_index)[0].tolist() == [False, False]


def test_a_processor_that_changes_the_raw_rewards_is_refused():
    class Rewrites:
        def process(self, batch):
            return batch.replace(raw_rewards=batch.raw_rewards + 1)

    b = batch([0.0, NAN])
    assert apply_processors([OverlongPenalty(20, 4)], b).raw_rewards is b.raw_rewards  # NaN kept, untouched
    with pytest.raises(ValueError, match="Rewrites changed raw_rewards"):
        apply_processors([Rewrites()], b)


def test_apply_processors_in_the_given_order():
    over, clip = OverlongPenalty(20, 4), Clip(0.0, 1.0)
    # rewards 1.5 at lengths 18, 25: penalty then clip = clip([1.0, 0.5]); clip then penalty = [1 - 0.5, 1 - 1]
    b = batch([1.5, 1.5], lengths=[18, 25])
    assert apply_processors([over, clip], b).rewards.tolist() == [1.0, 0.5]
    assert apply_processors([clip, over], b).rewards.tolist() == [0.5, 0.0]
    out = apply_processors([over, ZeroVarianceFilter()], b)
    assert set(out.metrics) == {"rollout/overlong_penalty_mean", "rollout/overlong_penalized_frac",
                                "rollout/filtered_group_frac"}
    assert apply_processors([], b) is b


def test_apply_processors_refuses_a_bad_processor():
    class Shrinks:
        def process(self, b):
            return b.replace(rewards=b.rewards[:1])

    class NotABatch:
        def process(self, b):
            return b.rewards

    with pytest.raises(ValueError, match="Shrinks changed the batch shape"):
        apply_processors([Shrinks()], batch([1.0, 0.0]))
    with pytest.raises(TypeError, match="NotABatch returned Tensor"):
        apply_processors([NotABatch()], batch([1.0, 0.0]))


def test_registration_and_capabilities():
    specs = {s.name: s for s in relax_register_reward_processors()}
    assert set(specs) == {"overlong_penalty", "format", "length_penalty", "clip", "zero_variance_filter"}
    for name in ("overlong_penalty", "format", "length_penalty", "clip"):
        assert not specs[name].capabilities_for().allowed_with_strict_estimators
        assert not specs[name].capabilities_for().may_request_more_samples
    zv = specs["zero_variance_filter"].capabilities_for()
    assert zv.allowed_with_strict_estimators and zv.may_request_more_samples
    cfg = RunConfig(rollout_max_response_len=20)
    built = {n: s.build(None, cfg) for n, s in specs.items()}
    assert built["overlong_penalty"] == OverlongPenalty(20, 4, 1.0)
    assert built["format"] == FormatReward(FormatParams().pattern, 0.0, -0.5)
    assert built["length_penalty"] == LengthPenalty(LengthPenaltyParams().coef)
    assert built["clip"] == Clip(ClipParams().min, ClipParams().max)
    assert built["zero_variance_filter"] == ZeroVarianceFilter(ZeroVarianceParams().eps)
