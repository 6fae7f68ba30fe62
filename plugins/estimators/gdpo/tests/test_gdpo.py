"""relax-gdpo: the contract kit, hand-derived advantages (and where GRPO on the sum differs),
weights, unscored parts, startup validation, and a 2-step run whose batches carry the
per-scorer rewards (``reward_parts``) to the estimator."""

import math

import pytest
import torch

from relax_authoring.testing import check_contract
from relax_authoring.testing.training import train_tiny
from relax_core.batch import Batch
from relax_core.config import build_config
from relax_core.contracts import AdvantageInput
from relax_core.host.plugins import default_registry
from relax_core.host.validation import resolve
from relax_core.numerics import group_advantages
from relax_core.stages.rollout import replay_path
from relax_gdpo.gdpo import gdpo_advantages

NAN = float("nan")


def _spec():
    return default_registry().get("estimator", "gdpo").spec


def _grpo(rewards, groups):
    return group_advantages(torch.tensor(rewards), torch.tensor(groups), baseline="mean",
                            std_normalization=True).advantages


def test_contract():
    check_contract(_spec())


def test_hand_derived_values_and_where_grpo_on_the_sum_differs():
    # one group of 4: r1 = [1, 0, 0, 0] -> A1 = [1.5, -0.5 x3]; r2 = [1, 1, 0, 0] -> A2 = ±0.866025;
    # S = A1 + A2, batch-normalised with its unbiased std 1.776148 (derivation in relax_gdpo.gdpo)
    parts = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    adv, frac = gdpo_advantages(parts, torch.zeros(4, dtype=torch.long), (1.0, 1.0))
    torch.testing.assert_close(adv, torch.tensor([1.332111, 0.206078, -0.769095, -0.769095]), atol=1e-5, rtol=0)
    assert frac == 0.0
    torch.testing.assert_close(_grpo([2.0, 1.0, 0.0, 0.0], [0] * 4),
                               torch.tensor([1.305582, 0.261116, -0.783349, -0.783349]), atol=1e-5, rtol=0)
    # weights 1, 0.5: S = A1 + 0.5·A2 = [1.933013, -0.066987, -0.933013 x2], std 1.351795
    adv, _ = gdpo_advantages(parts, torch.zeros(4, dtype=torch.long), (1.0, 0.5))
    torch.testing.assert_close(adv, torch.tensor([1.429960, -0.049554, -0.690203, -0.690203]), atol=1e-5, rtol=0)


def test_reward_combinations_that_grpo_collapses_stay_apart():
    """GDPO §3: group 0 passes one reward ([1, 1, 0, 0] and [0, 0, 0, 0]), group 1 both; GRPO
    on the sums ([1, 1, 0, 0] and [2, 2, 0, 0]) gives both groups the same advantages, GDPO
    gives group 1 twice group 0's (its second reward adds a group-normalised ±0.866)."""
    groups = [0] * 4 + [1] * 4
    first = [1.0, 1.0, 0.0, 0.0] * 2
    second = [0.0] * 4 + [1.0, 1.0, 0.0, 0.0]
    grpo = _grpo([a + b for a, b in zip(first, second)], groups)
    torch.testing.assert_close(grpo[:4], grpo[4:])
    adv, frac = gdpo_advantages(torch.tensor([first, second]).T, torch.tensor(groups), (1.0, 1.0))
    torch.testing.assert_close(adv[4:], 2 * adv[:4], atol=1e-5, rtol=0)
    # group 0: S = ±0.866025, group 1: ±1.732051; mean 0, unbiased std over 8 = sqrt((4·0.75 + 4·3)/7)
    s = math.sqrt((4 * 0.75 + 4 * 3.0) / 7)
    torch.testing.assert_close(adv[:2], torch.full((2,), 0.866025 / s), atol=1e-5, rtol=0)
    assert frac == 0.0  # group 0's second reward is constant, but its first is not


def test_a_sample_any_scorer_left_unscored_gets_zero_and_counts_nowhere():
    parts = torch.tensor([[1.0, 0.0], [0.0, NAN], [0.0, 1.0], [1.0, 1.0], [0.5, 0.5]])
    groups = torch.tensor([3, 3, 3, 3, 8])
    adv, frac = gdpo_advantages(parts, groups, (1.0, 1.0))
    assert adv[1] == 0.0
    keep = torch.tensor([0, 2, 3, 4])
    torch.testing.assert_close(adv[keep], gdpo_advantages(parts[keep], groups[keep], (1.0, 1.0))[0])
    # a lone sample's group has no signal, and the batch mean of S is 0 (each group's is): it stays 0
    assert abs(float(adv[4])) < 1e-6
    assert frac == 0.5  # group 8 (one member) has no signal; group 3 has
    with pytest.raises(ValueError, match=r"reward_parts must be \[B, 3\]"):
        gdpo_advantages(parts, groups, (1.0, 1.0, 1.0))


def test_startup_needs_several_rewards_and_no_post_processor():
    reg = default_registry()

    def problems(**cli):
        cfg = build_config(cli={"advantage_estimator": "gdpo", **cli}, param_schemas=reg.param_schemas())
        return [p for p in resolve(cfg, reg)[1] if p.component.startswith("estimator")]

    (p,) = problems(reward=("math",))
    assert p.constraint == "requires_fields" and "relax-gdpo" in p.component
    assert "'reward_parts', which needs several rewards: give --reward more than once" in p.message
    assert p.fix == "give --reward more than once"
    two = {"reward": ("math", "f1")}
    assert problems(**two) == []
    assert [p.constraint for p in problems(**two, reward_processor=("overlong_penalty",))] == \
        ["allows_reward_post_processors"]
    assert [p.constraint for p in problems(**two, disable_rewards_normalization=True)] == \
        ["requires_rewards_normalization"]


def test_a_run_carries_each_scorers_reward_to_the_estimator(tmp_path):
    """math (0 for the random model's words) and a tiny random reward model (a different
    float per sample), weights 1 and 0.5."""
    tiny_reward_model = pytest.importorskip("relax_reward_model.testing").tiny_reward_model
    rm = tiny_reward_model(tmp_path / "rm")
    steps = train_tiny(tmp_path, "--estimator", "gdpo", "--reward", "math", "--reward", "reward_model",
                       "--reward-model-path", rm, "--reward-weights", "1,0.5")
    assert all(math.isfinite(s["train/loss"]) for s in steps)
    assert all("rollout/reward/math" in s and "rollout/reward/reward_model" in s for s in steps)
    batch = Batch.load(replay_path(tmp_path / "rollouts", 1))
    parts = batch.reward_parts
    assert parts.shape == (batch.size, 2)
    scored = torch.isfinite(batch.rewards)
    assert scored.all() and len(set(parts[:, 1].tolist())) == batch.size  # the model's scores differ
    torch.testing.assert_close(batch.rewards, parts[:, 0] + 0.5 * parts[:, 1])
    cfg = build_config(cli={"reward": ("math", "reward_model"), "reward_weights": (1.0, 0.5)})
    out = _spec().build(_spec().default_params(), cfg).compute_advantages(AdvantageInput(**batch.items()))
    assert out.normalized and out.advantages.shape == batch.loss_mask.shape


def test_the_recipe_is_valid():
    from pathlib import Path

    from relax_core.config import load_yaml

    reg = default_registry()
    recipe = Path(__file__).resolve().parents[4] / "examples" / "recipes" / "gdpo.yaml"
    cfg = build_config(yaml_values=load_yaml(recipe), param_schemas=reg.param_schemas())
    assert cfg.advantage_estimator == "gdpo" and cfg.reward == ("reasoning_gym", "f1")
    assert resolve(cfg, reg)[1] == []
