"""relax-difficulty: the contract kit, pass rates, weights, draws and histogram by hand,
its parameters and its startup refusal."""

import importlib.metadata as md
import math

import pytest
import torch

from relax_authoring.testing import check_contract
from relax_core.data import DataError
from relax_core.sampling import PromptResults
from relax_difficulty.plugin import DifficultyParams, relax_register_samplers

SPEC = relax_register_samplers()[0]
NAN = math.nan


def make(n, **params):
    return SPEC.build(DifficultyParams(**params))(n, 0)


def results(prompts, rewards):
    return PromptResults(prompt_index=torch.tensor(prompts), rewards=torch.tensor(rewards, dtype=torch.float32),
                         group_index=torch.tensor(prompts))


def test_contract():
    check_contract(SPEC)


def test_pass_rates_weights_and_histogram_by_hand():
    s = make(4, window=3, explore_floor=0.05)
    s.observe(results([0, 0, 0, 0, 1, 1, 1, 1, 2, 2], [1.0, 0.0, 1.0, NAN, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]))
    # NaN gives no outcome; prompt 0: 1,0,1 (2/3, in the band); 1: all fail (too hard); 2: all pass (too easy); 3 unseen
    assert s.state()["outcomes"] == {"0": [1, 0, 1], "1": [0, 0, 0], "2": [1, 1]}
    assert s.weights() == [1.0, 0.05, 0.05, 1.0]
    m = s.metrics()
    assert m["sampler/difficulty/seen_frac"] == 0.75 and m["sampler/difficulty/in_band_frac"] == pytest.approx(1 / 3)
    # 2/3 -> [0.6, 0.8); 0 -> [0, 0.2); 1 -> the last bin, which includes 1
    assert [m[f"sampler/difficulty/pass_rate_hist/{b}"] for b in ("0.0-0.2", "0.2-0.4", "0.4-0.6", "0.6-0.8", "0.8-1.0")] \
        == [1.0, 0.0, 0.0, 1.0, 1.0]
    s.observe(results([0, 0], [0.0, 0.0]))  # the window keeps the 3 most recent: 1, 0, 0 -> 1/3, still in the band
    assert s.state()["outcomes"]["0"] == [1, 0, 0] and s.weights()[0] == 1.0


def test_pass_threshold_and_bounds():
    s = make(2, pass_threshold=0.5, min_pass_rate=0.25, max_pass_rate=0.75)
    s.observe(results([0, 0, 0, 0, 1, 1], [0.5, 0.49, 0.7, 0.0, 0.5, 0.0]))
    # prompt 0 passes 0.5 and 0.7: rate 0.5 in (0.25, 0.75); prompt 1: 0.5 -> rate 0.5 too
    assert s.state()["outcomes"] == {"0": [1, 0, 1, 0], "1": [1, 0]} and s.weights() == [1.0, 1.0]
    s.observe(results([1, 1], [1.0, 1.0]))  # prompt 1: 3 of 4 = 0.75, at the upper bound: too easy
    assert s.weights() == [1.0, 0.05]


def test_draws_keep_to_the_band():
    """Prompts 0-3 are solved always or never; with a tiny floor every draw of 2 is the
    unseen pair {4, 5} (uniform draws would give it 1 time in 15)."""
    s = make(6, explore_floor=1e-9)
    s.observe(results([0, 0, 1, 1, 2, 2, 3, 3], [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]))
    assert all(sorted(s.take(2)) == [4, 5] for _ in range(50))


def test_exploration_floor_is_the_relative_weight():
    """n=2, prompt 0 too easy (weight 0.05), prompt 1 in the band (1): take(1) gives prompt 0
    with probability 0.05 / 1.05 = 0.048, i.e. about 19 times in 400 (binomial sd 4.3)."""
    s = make(2)
    s.observe(results([0, 0, 1, 1], [1.0, 1.0, 1.0, 0.0]))
    count = sum(s.take(1) == [0] for _ in range(400))
    assert 6 <= count <= 32, count


def test_more_than_the_rows_and_distinct_within_a_draw():
    s = make(3)
    batch = s.take(7)  # successive draws of distinct rows: 3 + 3 + 1
    assert len(batch) == 7 and sorted(batch[:3]) == sorted(batch[3:6]) == [0, 1, 2]


def test_state_for_other_data_is_refused():
    s = make(3)
    s.take(1)
    with pytest.raises(DataError, match="for 3 rows / seed 0, but this run has 4 rows"):
        make(4).load(s.state())
    with pytest.raises(DataError, match="resume with the same --data, --seed and --sampler"):
        make(3).load({"n": 3, "seed": 0, "epoch": 0, "position": 1})  # a uniform sampler's state


def test_bounds_must_leave_a_band():
    assert DifficultyParams().problems() == []
    (msg, fix), = DifficultyParams(min_pass_rate=0.5, max_pass_rate=0.5).problems()
    assert "must be below --difficulty-max-pass-rate 0.5" in msg and "min < max" in fix


def test_refused_with_resume_onto_changed_data():
    from relax_core.config import build_config
    from relax_core.host.plugins import default_registry
    from relax_core.host.validation import resolve

    reg = default_registry()
    cli = {"sampler": "difficulty", "resume": True, "resume_allow_data_change": True}
    _, problems = resolve(build_config(cli=cli, param_schemas=reg.param_schemas()), reg)
    (p,) = [p for p in problems if p.constraint == "needs_stable_prompt_ids"]
    assert p.component == f"sampler 'difficulty' (relax-difficulty {md.version('relax-difficulty')})"
    assert "--resume-allow-data-change" in p.message and "drop --resume-allow-data-change" in p.fix
    _, problems = resolve(build_config(cli={**cli, "sampler": "uniform"}, param_schemas=reg.param_schemas()), reg)
    assert not [p for p in problems if p.constraint == "needs_stable_prompt_ids"]


def test_entry_point():
    eps = {ep.name: ep.value for ep in md.entry_points(group="relax.plugins")}
    assert eps.get("difficulty") == "relax_difficulty.plugin"
