"""Tests of relax-dapo: the contract kit, values derived by hand, startup validation."""

import json
import math
import subprocess
import sys

import torch

from relax_core.contracts import AdvantageInput, PolicyLossInput
from relax_dapo import plugin


def _spec():
    return plugin.relax_register_estimators()[0]


def _run(*args):
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True)


def test_contract(relax_contract):
    relax_contract(_spec())


def test_advantages_are_group_normalised():
    est = _spec().build()
    mask = torch.ones(4, 2, dtype=torch.bool)
    out = est.compute_advantages(AdvantageInput(rewards=torch.tensor([1.0, 0.0, 0.0, 0.0]),
                                                group_index=torch.tensor([7, 7, 7, 7]), loss_mask=mask))
    # mean 0.25, unbiased std 0.5 -> (1 - 0.25)/0.5 = 1.5, (0 - 0.25)/0.5 = -0.5 (minus the 1e-6 eps)
    torch.testing.assert_close(out.advantages[:, 0], torch.tensor([1.499997, -0.499999, -0.499999, -0.499999]))


def test_decoupled_clip_by_hand():
    est = _spec().build()
    # ratios 1.25 (inside [0.8, 1.28]), 1.3 (above 1.28), 0.75 (below 0.8), 0.75
    ratio = torch.tensor([[1.25, 1.3, 0.75, 0.75]])
    A = torch.tensor([[1.0, 1.0, -1.0, 1.0]])
    logp = torch.log(ratio).clone().requires_grad_(True)
    out = est.policy_loss(PolicyLossInput(log_probs=logp, old_log_probs=torch.zeros(1, 4), advantages=A,
                                          loss_mask=torch.ones(1, 4, dtype=torch.bool)))
    # loss = max(-rA, -clip(r)A): 1.25 -> -1.25; 1.3, A>0 -> -1.28 (clipped); 0.75, A<0 -> 0.8 (clipped);
    # 0.75, A>0 -> -0.75 (pessimistic branch is the unclipped one)
    torch.testing.assert_close(out.loss, torch.tensor([[-1.25, -1.28, 0.8, -0.75]]))
    out.loss.sum().backward()
    # d/dlogp of -rA = -rA where unclipped; 0 where the clip binds
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.25, 0.0, 0.0, -0.75]]))
    torch.testing.assert_close(out.token_metrics["pg_clipfrac"], torch.tensor([[0.0, 1.0, 1.0, 0.0]]))


def test_listed_and_shown_in_the_matrix():
    plugins = json.loads(_run("plugins", "--json").stdout)["plugins"]
    assert any(p["name"] == "dapo" and p["status"] == "ok" for p in plugins)
    caps = json.loads(_run("capabilities", "--json", "--kind", "estimator").stdout)
    assert caps["estimator"]["components"]["dapo"]["requires_per_token_loss"] is True


def test_validator_requires_per_token_loss():
    bad = _run("train", "--dry-run", "--advantage-estimator", "dapo")
    assert bad.returncode == 2
    assert "dapo" in bad.stderr and "requires_per_token_loss" in bad.stderr and "relax-dapo" in bad.stderr
    ok = _run("train", "--dry-run", "--advantage-estimator", "dapo", "--calculate-per-token-loss", "--dapo-clip-high", "0.3")
    assert ok.returncode == 0, ok.stderr
    cfg = json.loads(ok.stdout)["config"]
    assert math.isclose(cfg["plugin_params"]["dapo"]["clip_high"], 0.3)
