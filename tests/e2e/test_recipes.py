"""examples/recipes: one per estimator, each valid (the dry run's resolve finds no problem)
and holding the specification's recommended settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_helpers import ESTIMATORS
from typer.testing import CliRunner

from relax_core.config import build_config, load_yaml
from relax_core.host.plugins import default_registry
from relax_core.host.validation import resolve

RECIPES = Path(__file__).resolve().parents[2] / "examples" / "recipes"


def _cfg(name: str):
    reg = default_registry()
    return build_config(yaml_values=load_yaml(RECIPES / f"{name}.yaml"), param_schemas=reg.param_schemas()), reg


def test_every_installed_estimator_has_a_recipe():
    names = set(default_registry().names("estimator"))
    missing = sorted(n for n in names if not (RECIPES / f"{n}.yaml").is_file())
    assert not missing, f"estimators without examples/recipes/<name>.yaml: {missing}"


@pytest.mark.parametrize("name", ESTIMATORS)
def test_recipe_is_valid(name):
    if name not in default_registry().names("estimator"):
        pytest.skip(f"estimator {name} not installed")
    cfg, reg = _cfg(name)
    assert cfg.advantage_estimator == name
    _, problems = resolve(cfg, reg)
    assert not problems, "\n".join(map(str, problems))


def test_recipes_hold_the_recommended_settings():
    reg = default_registry()
    if not {"cispo", "m2po", "rloo"} <= set(reg.names("estimator")):
        pytest.skip("cispo, m2po and rloo needed")
    cispo, _ = _cfg("cispo")
    assert (cispo.params_for("cispo").eps_clip, cispo.params_for("cispo").eps_clip_high) == (0.2, 10.0)
    assert cispo.use_kl_loss and cispo.kl_loss_coef == 0.001 and cispo.kl_loss_type == "low_var_kl"
    assert cispo.correction == ("tis",)
    m2po, _ = _cfg("m2po")
    p = m2po.params_for("m2po")
    assert (p.kl2_budget, p.miniclip_low, p.miniclip_high) == (0.01, 0.2, 0.28)
    rloo, _ = _cfg("rloo")
    assert (rloo.rollout_batch_size, rloo.n_samples_per_prompt, rloo.effective_global_batch_size) == (4, 8, 32)
    assert rloo.calculate_per_token_loss


def test_dry_run_through_the_cli():
    from cli.main import app

    res = CliRunner().invoke(app, ["train", "--config", str(RECIPES / "grpo.yaml"), "--dry-run"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)  # the notes go to stderr
    assert out["valid"] and out["config"]["advantage_estimator"] == "grpo"


def test_lora_recipe_is_valid_and_trains_adapters():
    cfg, reg = _cfg("grpo-lora")
    _, problems = resolve(cfg, reg)
    assert not problems, "\n".join(map(str, problems))
    assert (cfg.advantage_estimator, cfg.lora_rank, cfg.lora_alpha, cfg.lr) == ("grpo", 16, 32.0, 3e-4)
    assert cfg.use_kl_loss and cfg.params_for("grpo").eps_clip == 0.2


def test_opd_recipe_is_valid():
    if "opd" not in default_registry().names("correction"):
        pytest.skip("relax-opd not installed")
    cfg, reg = _cfg("opd")
    assert cfg.correction == ("opd",) and cfg.teacher_model == "smollm2-135m-instruct"
    assert cfg.params_for("opd").coef == 1.0
    _, problems = resolve(cfg, reg)
    assert not problems, "\n".join(map(str, problems))
