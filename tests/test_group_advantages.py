"""relax_core.numerics.group_advantages: GRPO / Dr.GRPO / leave-one-out values and edge cases."""

import math

import pytest
import torch

from relax_core.numerics import group_advantages

NAN = float("nan")


def _adv(rewards, groups=None, **kw):
    r = torch.tensor(rewards, dtype=torch.float32)
    g = torch.zeros(len(rewards), dtype=torch.long) if groups is None else torch.tensor(groups)
    return group_advantages(r, g, **kw)


def test_grpo_values():
    out = _adv([1, 0, 0, 0], baseline="mean", std_normalization=True)
    torch.testing.assert_close(out.advantages, torch.tensor([1.499997, -0.499999, -0.499999, -0.499999]), atol=1e-6, rtol=0)
    # 3 correct of 8: mean 3/8, s = sqrt(15/56); (5/8)/s, (-3/8)/s
    s = math.sqrt(15 / 56)
    out = _adv([1, 1, 1, 0, 0, 0, 0, 0], baseline="mean", std_normalization=True)
    assert out.advantages[0].item() == pytest.approx(0.625 / (s + 1e-6), abs=1e-6) == pytest.approx(1.207612, abs=1e-6)
    assert out.advantages[-1].item() == pytest.approx(-0.724567, abs=1e-6)
    out = _adv([1, NAN, 0, 0], baseline="mean", std_normalization=True)
    torch.testing.assert_close(out.advantages, torch.tensor([1.154699, 0.0, -0.577349, -0.577349]), atol=1e-6, rtol=0)


def test_dr_grpo_and_leave_one_out_values():
    torch.testing.assert_close(_adv([1, 0, 0, 0], baseline="mean").advantages, torch.tensor([0.75, -0.25, -0.25, -0.25]))
    torch.testing.assert_close(_adv([1, 0, 0, 0], baseline="leave_one_out").advantages, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    loo = _adv([1, 1, 1, 0, 0, 0, 0, 0], baseline="leave_one_out").advantages
    assert loo[0].item() == pytest.approx(5 / 7) and loo[-1].item() == pytest.approx(-3 / 7)
    assert abs(loo.sum().item()) < 1e-6
    torch.testing.assert_close(_adv([1, NAN, 0, 0], baseline="leave_one_out").advantages, torch.tensor([1.0, 0.0, -0.5, -0.5]))
    torch.testing.assert_close(_adv([1, 0], baseline="leave_one_out").advantages, torch.tensor([1.0, -1.0]))


def test_groups_by_index_not_position():
    inter = _adv([1, 5, 0, 5, 0, 7, 0, 7], [0, 1, 0, 1, 0, 1, 0, 1], baseline="mean", std_normalization=True)
    a = _adv([1, 0, 0, 0], baseline="mean", std_normalization=True).advantages
    b = _adv([5, 5, 7, 7], baseline="mean", std_normalization=True).advantages
    torch.testing.assert_close(inter.advantages[0::2], a)
    torch.testing.assert_close(inter.advantages[1::2], b)
    # arbitrary (non-dense) group ids
    torch.testing.assert_close(_adv([1, 0, 0, 0], [17, 17, 17, 17], baseline="mean").advantages, torch.tensor([0.75, -0.25, -0.25, -0.25]))


@pytest.mark.parametrize("baseline,std", [("mean", True), ("mean", False), ("leave_one_out", False)])
def test_no_signal_groups_are_exactly_zero(baseline, std):
    # all equal (0.1 is not exact in binary: the mean differs from each value by rounding),
    # one scorable sample, no scorable sample, and a real group
    out = _adv([0.1, 0.1, 0.1, 3.0, NAN, NAN, NAN, NAN, 1.0, 0.0], [0, 0, 0, 1, 1, 2, 2, 2, 3, 3],
               baseline=baseline, std_normalization=std)
    assert torch.isfinite(out.advantages).all()
    assert (out.advantages[:8] == 0).all()
    assert (out.advantages[8:] != 0).all()
    assert out.group_no_signal.tolist() == [True, True, True, False]
    assert out.zero_std_group_frac == 0.75


def test_errors():
    with pytest.raises(ValueError):
        _adv([1.0, 0.0], baseline="median")
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.long), baseline="mean")


@pytest.mark.parametrize("baseline,std", [("mean", True), ("mean", False), ("leave_one_out", False)])
def test_near_equal_group_is_zero_by_tolerance(baseline, std):
    # std ≈ 5.8e-10 > 0 but ≤ ZERO_STD_TOL: without the tolerance GRPO would give ±6.7e-4
    r = torch.tensor([1.0, 1.0 + 1e-9, 1.0, 2.0, 0.0], dtype=torch.float64)
    out = group_advantages(r, torch.tensor([0, 0, 0, 1, 1]), baseline=baseline, std_normalization=std)
    assert (out.advantages[:3] == 0).all() and (out.advantages[3:] != 0).all()
    assert out.advantages.dtype == torch.float32
    assert out.group_no_signal.tolist() == [True, False]


def test_the_group_advantage_block_is_declared_once_and_composed():
    import dataclasses

    from relax_core import GroupAdvantageParams
    from relax_core.host.plugins import default_registry

    reg = default_registry()
    block = {f.name: f for f in dataclasses.fields(GroupAdvantageParams)}
    for name in ("grpo", "gspo", "sapo", "cispo"):
        schema = reg.get("estimator", name).spec.params
        assert issubclass(schema, GroupAdvantageParams), name
        assert {f.name: f for f in dataclasses.fields(schema) if f.name in block} == block, name
