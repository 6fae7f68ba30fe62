"""routing_replay (R3): identity on the loss, capabilities, startup refusal for a dense
model, and a 2-step run on a tiny Qwen3-MoE whose rollout records routes.  The record and
replay mechanics are tested in tests/core/test_routing.py."""

from __future__ import annotations

import json

import pytest
import torch

from relax_core.contracts import CorrectionInput
from relax_routing_replay.plugin import relax_register_corrections
from relax_routing_replay.routing_replay import build


def test_apply_returns_the_loss_unchanged():
    lp = torch.randn(2, 3, requires_grad=True)
    loss = -lp * 2
    out = build(None, None).apply(CorrectionInput(
        loss=loss, log_probs=lp, old_log_probs=lp.detach(), advantages=torch.ones(2, 3),
        loss_mask=torch.ones(2, 3, dtype=torch.bool), behaviour_numerator="old_log_probs"))
    assert out.loss is loss and not out.token_metrics


def test_capabilities():
    caps = relax_register_corrections()[0].capabilities_for()
    assert caps.needs_moe_model and caps.needs_routing_replay and "routed_experts" in caps.requires_fields and "*" in caps.behaviour_numerators


def _dry_run(*args):
    from typer.testing import CliRunner

    from cli.main import app

    return CliRunner().invoke(app, ["train", "--dry-run", "--correction", "routing_replay", *args])


def test_dense_model_refused_moe_accepted(tmp_path):
    res = _dry_run()  # the default model (SmolLM2) is dense
    assert res.exit_code == 2
    assert "correction 'routing_replay'" in res.output and "[needs_moe_model]" in res.output
    assert "dense" in res.output and "fix:" in res.output
    moe = tmp_path / "moe"
    moe.mkdir()
    (moe / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "num_experts": 4}))
    res = _dry_run("--model", str(moe))
    assert res.exit_code == 0, res.output
    res = _dry_run("--model", str(moe), "--train-backend", "megatron")  # no replay in that backend
    assert res.exit_code == 2 and "[needs_routing_replay]" in res.output and "backend 'megatron'" in res.output
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert _dry_run("--model", str(dense)).exit_code == 2


def test_contract():
    from relax_authoring.testing import check_contract

    check_contract(relax_register_corrections()[0])


from relax_authoring.testing.training import train_tiny as _train  # noqa: E402  (2-step run of the real loop)


@pytest.mark.slow
def test_two_step_training_run(tmp_path):
    from safetensors.torch import load_file

    _train(tmp_path, "--correction", "routing_replay", moe=True)
    batch = load_file(str(tmp_path / "rollouts" / "step_000001.safetensors"))
    routes, mask = batch["routed_experts"], batch["loss_mask"].bool()
    assert routes.shape[:2] == mask.shape and routes.shape[2:] == (2, 2)  # [B, T, L=2, E=2]
    assert ((routes[mask] >= 0) & (routes[mask] < 4)).all()
    lengths = batch["response_lengths"]
    beyond = torch.arange(routes.shape[1])[None] >= lengths[:, None]
    assert (routes[beyond] == -1).all()
