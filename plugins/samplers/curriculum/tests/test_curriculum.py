"""relax-curriculum: the contract kit, the level moves by hand (up, down, only the current
level's samples counted), resume exactness mid-run, the ``rgc:`` rows, and the startup
refusal of data without curriculum levels."""

import importlib.metadata as md
import json
import math

import pytest
import torch

from relax_authoring.testing import check_contract
from relax_core.data import DataError
from relax_core.sampling import PromptResults
from relax_curriculum.plugin import CurriculumParams, relax_register_samplers

SPEC = relax_register_samplers()[0]
LEVELS = [0, 0, 0, 1, 1, 1, 2, 2, 2]


def make(levels=LEVELS, **params):
    return SPEC.build(CurriculumParams(**params))(len(levels), 0, levels)


def results(prompts, rewards):
    return PromptResults(prompt_index=torch.tensor(prompts), rewards=torch.tensor(rewards, dtype=torch.float32),
                         group_index=torch.tensor(prompts))


def test_contract():
    check_contract(SPEC)


def test_moves_up_when_the_window_passes_the_threshold_and_down_below_demote():
    s = make(window=4, threshold=0.75, demote_below=0.25)
    assert set(s.take(3)) == {0, 1, 2} and s.metrics()["sampler/level"] == 0.0
    s.observe(results([0, 1, 2], [1.0, 0.0, 1.0]))  # 3 outcomes < window: no decision
    assert s.level == 0 and s.metrics()["sampler/curriculum/accuracy"] == pytest.approx(2 / 3)
    s.observe(results([4, 0], [0.0, 1.0]))  # row 4 is level 1: not counted; window [1, 0, 1, 1] = 0.75
    assert s.level == 1 and s.metrics() == {"sampler/level": 1.0, "sampler/curriculum/accuracy": 0.0,
                                            "sampler/curriculum/moves": 1.0}
    assert set(s.take(3)) == {3, 4, 5}
    s.observe(results([3, 4, 5, 3], [0.5, math.nan, 0.0, 1.0]))  # 0.5 < pass threshold 1; NaN skipped: 3 outcomes
    assert s.level == 1
    s.observe(results([4], [0.0]))  # [0, 0, 1, 0] = 0.25: not below 0.25, not up
    assert s.level == 1
    s.observe(results([5], [0.0]))  # last 4: [0, 1, 0, 0] = 0.25
    s.observe(results([5], [0.0]))  # [1, 0, 0, 0] = 0.25
    s.observe(results([5], [0.0]))  # [0, 0, 0, 0] = 0 < 0.25: down
    assert s.level == 0 and s.moves == 2


def test_the_top_level_stays_and_more_prompts_than_its_rows_repeat_across_draws():
    s = make(window=1, threshold=0.5, start_level=7)  # clipped to the highest level, 2
    assert s.level == 2
    s.observe(results([6], [1.0]))
    assert s.level == 2 and s.moves == 0
    got = s.take(5)
    assert len(got) == 5 and set(got) == {6, 7, 8} and len(set(got[:3])) == 3


def test_resume_mid_run_gives_the_same_prompts():
    def run(s, steps):
        out = []
        for _ in range(steps):
            idx = s.take(2)
            s.observe(results(idx, [1.0 if i % 2 == 0 else 0.0 for i in idx]))
            out.append((idx, s.metrics()))
        return out

    a = make(window=3, threshold=0.5)
    run(a, 3)
    saved = json.loads(json.dumps(a.state()))
    after = run(a, 6)
    assert {m["sampler/level"] for _, m in after} != {0.0}  # it moved during the compared steps
    b = make(window=3, threshold=0.5)
    b.load(saved)
    assert run(b, 6) == after
    with pytest.raises(DataError, match="resume with the same --data"):
        make(levels=[0, 1]).load(saved)
    other = make(levels=[0, 0, 1, 1])  # --resume-allow-data-change: the level carries over when the data have it
    other.load({**saved, "level": 1}, allow_other_data=True)
    assert other.level == 1
    other = make(levels=[0, 0, 1, 1])
    other.load({**saved, "level": 2}, allow_other_data=True)
    assert other.level == 0 and other.draws == 0


def test_demote_must_be_below_threshold():
    assert CurriculumParams().problems() == []
    (msg, fix), = CurriculumParams(threshold=0.5, demote_below=0.5).problems()
    assert "--curriculum-demote-below 0.5 must be below --curriculum-threshold 0.5" in msg


def test_rgc_rows_follow_reasoning_gyms_curriculum_levels():
    from relax_reasoning_gym.rg import load_curriculum_rows

    rows = load_curriculum_rows("chain_sum?size=5&levels=3&seed=1")
    assert [r["metadata"]["rg_level"] for r in rows] == [0] * 5 + [1] * 5 + [2] * 5
    terms = [r["metadata"]["rg_entry"]["metadata"]["num_terms"] for r in rows]
    assert max(terms[:5]) == 2 and max(terms[10:]) <= 4 and max(terms[5:]) > 2  # level l: up to 2 + l terms
    for bad, why in (("chain_sum?levels=99", "levels must be in"), ("chain_sum?size=3&x=1", "the keys are"),
                     ("nosuch", "unknown reasoning-gym dataset")):
        with pytest.raises(ValueError, match=why):
            load_curriculum_rows(bad)


def test_data_without_levels_is_refused_at_startup_naming_rgc():
    from relax_core.host.plugins import default_registry
    from relax_core.run.launch import BadInput, configure, preflight

    reg = default_registry()
    cfg, resolved, _ = configure(["--sampler", "curriculum", "--data", "rg:chain_sum?size=8", "--eval-data", "none",
                                  "--reward-num-workers", "1"], reg)
    with pytest.raises(BadInput) as e:
        preflight(cfg, resolved, reg)
    (msg,) = [p for p in e.value.problems if "--sampler curriculum" in p]
    assert "metadata['rg_level'], which 8 of the 8 rows" in msg and "use --data rgc:<dataset>" in msg


def test_entry_point():
    eps = {ep.name: ep.value for ep in md.entry_points(group="relax.plugins")}
    assert eps.get("curriculum") == "relax_curriculum.plugin"


def test_the_loop_draws_the_current_level_and_logs_it_with_an_llm_judge(tmp_path):
    """Two steps of the real loop: the curriculum gets the rows' levels from --data rgc:, and
    the llm_judge scores through the reward workers (the tiny random model never writes a
    verdict word: every sample unscored and counted invalid)."""
    from relax_authoring.testing.training import train_tiny

    steps = train_tiny(tmp_path, "--sampler", "curriculum", "--data", "rgc:chain_sum?size=3&levels=2",
                       "--eval-data", "none", "--reward", "llm_judge", "--llm-judge-model", str(tmp_path / "model"),
                       "--llm-judge-max-new-tokens", "2", "--reward-timeout", "120", "--reward-num-workers", "1")
    assert [m["sampler/level"] for m in steps] == [0.0, 0.0]
    assert [m["rollout/reward/llm_judge/invalid"] for m in steps] == [4.0, 4.0]  # 2 prompts x 2 samples
    trained = [json.loads(x) for x in (tmp_path / "runs" / "r" / "trained_prompts.jsonl").read_text().splitlines()]
    assert len(trained) == 2 and all(i < 3 for t in trained for i in t["prompt_index"])  # level 0: rows 0-2
