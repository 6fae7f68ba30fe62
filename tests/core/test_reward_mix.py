"""Composite rewards (relax_core.stages.reward_mix): the weighted sum, its metrics per part, and the
startup refusal of inconsistent --reward / --reward-weights."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from cli.main import app
from relax_core import RewardScorerSpec
from relax_core.config import RunConfig
from relax_core.host.plugins import load_registry
from relax_core.stages.reward_mix import combine, part_metrics, problems, step_metrics
from relax_core.stages.rewarding import resolve_scorers, shutdown_pools
from relax_core_test_toys import make_plugin

pytestmark = pytest.mark.timeout(120)


def test_combine_and_part_metrics_by_hand():
    parts = [[1.0, 0.0, 0.0], [1.0, 2.0, None]]
    assert combine(parts, (1.0, 0.5)) == [1.5, 1.0, None]  # any unscored part: unscored, never 0
    assert combine(parts[:1], (2.0,)) == [2.0, 0.0, 0.0]
    m = part_metrics(["a", "b"], parts)
    assert m == {"rollout/reward/a": pytest.approx(1 / 3), "rollout/reward/b": 1.5}
    assert math.isnan(part_metrics(["c"], [[None]])["rollout/reward/c"])


def test_step_metrics_sum_counts_and_average_means():
    rounds = [{"rollout/reward_errors": 1.0, "rollout/reward_timeouts": 0.0, "rollout/reward/a": 0.5},
              {"rollout/reward_errors": 2.0, "rollout/reward_timeouts": 1.0, "rollout/reward/a": 1.0}]
    assert step_metrics(rounds) == {"rollout/reward_errors": 3.0, "rollout/reward_timeouts": 1.0,
                                    "rollout/reward/a": 0.75}
    rounds[0]["rollout/reward/a/invalid"], rounds[1]["rollout/reward/a/invalid"] = 2.0, 3.0  # a scorer's count
    assert step_metrics(rounds)["rollout/reward/a/invalid"] == 5.0 and step_metrics(rounds)["rollout/reward/a"] == 0.75


def test_make_score_sums_the_weighted_parts_through_the_pool():
    from relax_core.run.launch import make_score

    specs = [RewardScorerSpec(name=n, summary=n, source="test", factory=f"rewarding_toy_scorers:build_{n}")
             for n in ("exact", "length")]
    reg = load_registry([("toys", make_plugin(*specs))], entry_points=False)
    cfg = RunConfig(reward=("exact", "length"), reward_weights=(1.0, 0.5), reward_num_workers=1)
    try:
        score = make_score(resolve_scorers(cfg, reg), cfg)
        rewards, metrics = score(["1", "22", ""], ["1", "1", "1"], [{}, {}, {}], ["p", "p", "p"])
    finally:
        shutdown_pools()
    # exact: 1, 0, 0; length: 1, 2, unscored -> 1 + 0.5, 0 + 1, unscored
    assert rewards == [1.5, 1.0, None]
    assert metrics == {"rollout/reward_errors": 0.0, "rollout/reward_timeouts": 0.0,
                       "rollout/reward/exact": pytest.approx(1 / 3), "rollout/reward/length": 1.5}


def test_make_score_with_one_weighted_scorer_logs_and_keeps_its_own_reward():
    """One --reward weighted 0 (pure distillation): every reward is 0, but the scorer's own
    rewards stay reachable (``parts``, for the evaluation) and its mean is logged."""
    from relax_core.run.launch import make_score

    spec = RewardScorerSpec(name="exact", summary="exact", source="test", factory="rewarding_toy_scorers:build_exact")
    reg = load_registry([("toys", make_plugin(spec))], entry_points=False)
    cfg = RunConfig(reward=("exact",), reward_weights=(0.0,), reward_num_workers=1)
    try:
        rewards, metrics = make_score(resolve_scorers(cfg, reg), cfg)(["1", "2", "1"], ["1", "1", "1"], [{}] * 3,
                                                                      ["p"] * 3)
    finally:
        shutdown_pools()
    assert rewards == [0.0, 0.0, 0.0] and rewards.parts == [[1.0, 0.0, 1.0]]
    assert metrics["rollout/reward/exact"] == pytest.approx(2 / 3)


def test_every_problem_of_the_weights_is_listed():
    msgs = problems(RunConfig(reward=("math", "gsm8k", "math"), reward_weights=(1.0, math.inf)))
    assert [o for o, _, _ in msgs] == ["--reward", "--reward-weights", "--reward-weights"]
    assert "math given more than once" in msgs[0][1]
    assert msgs[1][1] == "2 weight(s) (1, inf) for 3 --reward scorer(s) (math, gsm8k, math)"
    assert "--reward-weights 1,1,1" in msgs[1][2] and "non-finite" in msgs[2][1]
    assert problems(RunConfig(reward=("math", "gsm8k"), reward_weights=(0.0, 0.0)))[0][1].startswith("every weight is 0")
    assert problems(RunConfig(reward=("math", "gsm8k"), reward_weights=(1.0, 0.5))) == []
    assert problems(RunConfig()) == []


def test_refused_at_startup_with_exit_2_naming_each_problem():
    r = CliRunner().invoke(app, ["train", "--dry-run", "--reward", "math", "--reward", "gsm8k",
                                 "--reward-weights", "1", "--rollout-batch-size", "0"])
    assert r.exit_code == 2, r.output
    assert "config [--reward-weights]: 1 weight(s) (1) for 2 --reward scorer(s) (math, gsm8k)" in r.stderr
    assert "fix: give one weight per --reward" in r.stderr and "rollout-batch-size" in r.stderr
    r = CliRunner().invoke(app, ["train", "--dry-run", "--reward", "math", "--reward-weights", "1,x"])
    assert r.exit_code == 2 and "expected comma-separated numbers, got '1,x'" in r.stderr
