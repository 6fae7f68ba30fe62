"""ICE-POP: pinned band weights, inclusive edges, no renormalisation, gradients, masking,
and the --tis-clip-low/--tis-clip flags shared with tis (each with its own default)."""

from __future__ import annotations

import math

import pytest
import torch

from relax_core.contracts import CorrectionInput
from relax_core.numerics import reduce_loss
from relax_icepop.icepop import IcePop, build
from relax_icepop.plugin import IcePopParams


def make_input(log_ratio, *, current=None, numerator="old_log_probs", mask=None, adv=None):
    old = torch.as_tensor(log_ratio, dtype=torch.float32)
    old = old.reshape(1, -1) if old.dim() == 1 else old
    rollout = torch.zeros_like(old)
    log_probs = (old.clone() if current is None else current).requires_grad_(True)
    mask = torch.ones(old.shape, dtype=torch.bool) if mask is None else mask
    adv = torch.ones(old.shape) if adv is None else adv
    return CorrectionInput(loss=-adv * log_probs, log_probs=log_probs, old_log_probs=old, advantages=adv,
                           loss_mask=mask, behaviour_numerator=numerator, rollout_log_probs=rollout)


def test_pinned_values_keep_tokens_zero_and_four():
    inp = make_input([0.1, -1.5, 0.8, -10.0, 0.3])
    out = IcePop(0.5, 2.0).apply(inp)
    rho = torch.tensor([1.105171, 0.223130, 2.225541, 4.5400e-05, 1.349859])
    torch.testing.assert_close(out.token_metrics["tis"][0], rho, rtol=1e-5, atol=1e-7)
    w = out.loss.detach() / inp.loss.detach()
    torch.testing.assert_close(w[0], torch.tensor([1.105171, 0.0, 0.0, 0.0, 1.349859]), rtol=1e-5, atol=0)
    assert out.token_metrics["tis_clipfrac"][0].tolist() == [0, 1, 1, 1, 0]


def test_inclusive_edges_and_rho_four():
    rule = IcePop(0.5, 2.0).is_weight
    assert rule(torch.tensor([0.5, 2.0, 0.4999, 2.0001, 4.0])).tolist() == pytest.approx([0.5, 2.0, 0.0, 0.0, 0.0])
    # through apply: exp(log 2) is exactly 2.0 in float32, and it is kept
    w = IcePop(0.5, 2.0).apply(make_input([math.log(2.0), math.log(0.5), math.log(4.0)]))
    assert (w.loss.detach() / -torch.tensor([[math.log(2.0), math.log(0.5), math.log(4.0)]])).tolist()[0] == \
        pytest.approx([2.0, 0.5, 0.0])
    # the slime oracle: ratios [0.1, 0.5, 1, 2, 5] -> [0, 0.5, 1, 2, 0]
    assert rule(torch.tensor([0.1, 0.5, 1.0, 2.0, 5.0])).tolist() == pytest.approx([0.0, 0.5, 1.0, 2.0, 0.0])


def test_not_renormalised_by_kept_tokens():
    # two of four tokens dropped: the token-mean still divides by all four valid tokens
    inp = make_input([0.0, 0.0, 3.0, -3.0])
    out = IcePop(0.5, 2.0).apply(inp)
    total = reduce_loss(out.loss, inp.loss_mask, "token-mean", num_tokens=4.0)
    assert total.item() == pytest.approx((-(0.0) - 0.0 + 0 + 0) / 4)
    inp = make_input([0.0, 0.0, 3.0, -3.0], current=torch.tensor([[-1.0, -2.0, -5.0, -5.0]]))
    out = IcePop(0.5, 2.0).apply(inp)
    total = reduce_loss(out.loss, inp.loss_mask, "token-mean", num_tokens=4.0)
    assert total.item() == pytest.approx((1.0 + 2.0) / 4)


def test_reinforce_numerator_and_no_gradient_through_weight():
    old, cur = torch.zeros(1, 3), torch.tensor([[0.2, -1.0, 0.9]])
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    inp = make_input(old, current=cur, numerator="log_probs", adv=adv)
    out = IcePop(0.5, 2.0).apply(inp)
    rho = torch.exp(cur)
    expect_w = torch.where((rho >= 0.5) & (rho <= 2.0), rho, torch.zeros(()))
    (g,) = torch.autograd.grad(out.loss.sum(), inp.log_probs)
    torch.testing.assert_close(g, -adv * expect_w)


def test_masked_garbage():
    mask = torch.tensor([[True, True, False]])
    res = []
    for fill in (0.0, float("nan"), 1e9):
        old = torch.tensor([[0.2, -0.3, fill]])
        inp = make_input(old, current=torch.tensor([[0.1, 0.1, 0.0]]), mask=mask)
        inp = inp.replace(rollout_log_probs=torch.tensor([[0.0, 0.0, -fill]]))
        out = IcePop(0.5, 2.0).apply(inp)
        (g,) = torch.autograd.grad(torch.where(mask, out.loss, 0.0).sum(), inp.log_probs)
        assert all(torch.isfinite(v).all() for v in out.token_metrics.values())
        res.append((out.loss.detach()[mask], g))
    for loss, g in res[1:]:
        torch.testing.assert_close(loss, res[0][0])
        torch.testing.assert_close(g, res[0][1])


def test_bounds_checked_and_defaults():
    assert (IcePopParams().clip_low, IcePopParams().clip) == (0.5, 2.0)
    with pytest.raises(ValueError, match="tis-clip-low"):
        build(IcePopParams(clip_low=2.5, clip=2.0), None)


def test_shared_flags_keep_own_defaults():
    from relax_core.config import build_config, parse_cli

    TISParams = pytest.importorskip("relax_tis.plugin").TISParams

    schemas = {"tis": TISParams, "icepop": IcePopParams}
    cfg = build_config(cli={}, param_schemas=schemas)
    assert (cfg.params_for("tis").clip_low, cfg.params_for("icepop").clip_low) == (0.0, 0.5)
    assert cfg.params_for("tis").clip == cfg.params_for("icepop").clip == 2.0
    cli, _, _ = parse_cli(["--tis-clip-low", "0.25", "--tis-clip", "3"], schemas)
    cfg = build_config(cli=cli, param_schemas=schemas)
    assert cfg.params_for("tis").clip_low == cfg.params_for("icepop").clip_low == 0.25
    assert cfg.params_for("tis").clip == cfg.params_for("icepop").clip == 3.0
    cfg = build_config(yaml_values={"tis_clip": 5}, param_schemas=schemas)
    assert cfg.params_for("tis").clip == cfg.params_for("icepop").clip == 5.0
    assert cfg.params_for("icepop").clip_low == 0.5


def test_cli_both_selected_conflict_and_each_alone_valid():
    pytest.importorskip("relax_tis")
    from typer.testing import CliRunner

    from cli.main import app

    res = CliRunner().invoke(app, ["train", "--dry-run", "--correction", "tis", "--correction", "icepop"])
    assert res.exit_code == 2
    assert "correction 'tis'" in res.output and "correction 'icepop'" in res.output
    assert "[conflicts_with]" in res.output and "select only one" in res.output
    res = CliRunner().invoke(app, ["train", "--dry-run", "--correction", "icepop"])
    assert res.exit_code == 0, res.output
    import json

    params = json.loads(res.stdout)["config"]["plugin_params"]
    assert params["icepop"]["clip_low"] == 0.5 and params["tis"]["clip_low"] == 0.0
    res = CliRunner().invoke(app, ["train", "--dry-run", "--correction", "icepop", "--use-rollout-logprobs"])
    assert res.exit_code == 2 and "correction 'icepop'" in res.output and "--use-rollout-logprobs" in res.output


def test_contract():
    testing = pytest.importorskip("relax_authoring.testing")
    if not hasattr(testing, "check_contract"):
        pytest.skip("relax_authoring.testing.check_contract not available yet")
    from relax_icepop.plugin import relax_register_corrections

    testing.check_contract(relax_register_corrections()[0])


from relax_authoring.testing.training import train_tiny as _train  # noqa: E402  (2-step run of the real loop)


@pytest.mark.slow
def test_two_step_training_run(tmp_path):
    for m in _train(tmp_path, "--correction", "icepop", "--advantage-estimator", "rloo", "--calculate-per-token-loss"):
        assert m["train/tis_clipfrac"] == 0.0 and m["train/tis"] == pytest.approx(1.0, abs=1e-3)


def test_cross_field_bounds_checked_at_startup_for_selected_corrections_only():
    from typer.testing import CliRunner

    from cli.main import app

    run = lambda *a: CliRunner().invoke(app, ["train", "--dry-run", *a])  # noqa: E731
    res = run("--correction", "icepop", "--tis-clip", "0.3")  # default low 0.5 > 0.3
    assert res.exit_code == 2
    assert "correction 'icepop'" in res.output and "[parameters]" in res.output
    assert "--tis-clip-low 0.5 is above --tis-clip 0.3" in res.output and "fix:" in res.output
    pytest.importorskip("relax_tis")
    assert run("--correction", "tis", "--tis-clip", "0.3").exit_code == 0  # icepop is not selected
    res = run("--correction", "tis", "--tis-clip-low", "3")
    assert res.exit_code == 2 and "correction 'tis'" in res.output and "[parameters]" in res.output
