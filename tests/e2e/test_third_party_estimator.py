"""A third-party estimator with a loss no built-in has works with the mismatch corrections
by declaring its behaviour numerator, and no new kind: startup validation reads the fact,
and TIS weights by ρ = exp(log num − log q) with the field it names (issue 17 item 3)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

import relax_toy_estimator  # noqa: E402
from relax_core.config import build_config  # noqa: E402
from relax_core.contracts import CorrectionInput, PolicyLossInput  # noqa: E402
from relax_core.host.plugins import load_registry  # noqa: E402
from relax_core.host.validation import resolve  # noqa: E402


@pytest.fixture(scope="module")
def registry():
    reg = load_registry([("gated", relax_toy_estimator.Plugin(), "relax-gated", "0.1")])
    if not {"tis", "icepop", "score_centering"} <= set(reg.names("correction")):
        pytest.skip("the tis, icepop and score_centering plugins are needed")
    return reg


def _problems(reg, estimator, *corrections):
    cfg = build_config(cli={"advantage_estimator": estimator, "correction": corrections}, param_schemas=reg.param_schemas())
    return [p for p in resolve(cfg, reg)[1] if p.constraint == "behaviour_numerators"]


def test_startup_reads_the_declared_numerator(registry):
    for corrections in (("tis",), ("icepop",)):
        assert _problems(registry, "gated", *corrections) == []
        assert _problems(registry, "gated_free", *corrections) == []
    assert _problems(registry, "gated_free", "score_centering") == []
    [p] = _problems(registry, "gated", "score_centering")       # a loss with a ratio: not a REINFORCE loss
    assert p.component.startswith("correction 'score_centering'")
    assert p.message == ("score_centering is not valid with estimator 'gated' whose behaviour numerator is "
                         "old_log_probs (needs log_probs)")
    assert "grpo --pg-loss-type reinforce" in p.fix
    [p] = _problems(registry, "gated_undeclared", "tis")       # declaring nothing is refused, naming both
    assert p.message == ("tis is not valid with estimator 'gated_undeclared' whose behaviour numerator is "
                         "undeclared (needs log_probs, old_log_probs)")


@pytest.mark.parametrize("estimator", ["gated", "gated_free"])
def test_tis_weights_with_the_field_the_estimator_names(registry, estimator):
    spec = registry.get("estimator", estimator).spec
    numerator = spec.capabilities_for().behaviour_numerator
    tis = registry.get("correction", "tis").spec.build()
    old, cur, q = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-0.5, -2.5]]), torch.tensor([[-1.2, -2.2]])
    lp = cur.clone().requires_grad_(True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss = spec.build().policy_loss(PolicyLossInput(log_probs=lp, old_log_probs=old, advantages=torch.ones(1, 2),
                                                    loss_mask=mask)).loss
    out = tis.apply(CorrectionInput(loss=loss, log_probs=lp, old_log_probs=old, advantages=torch.ones(1, 2),
                                    loss_mask=mask, rollout_log_probs=q, behaviour_numerator=numerator))
    num = old if numerator == "old_log_probs" else cur
    torch.testing.assert_close(out.loss.detach() / loss.detach(), torch.exp(num - q).clamp(0.0, 2.0))
