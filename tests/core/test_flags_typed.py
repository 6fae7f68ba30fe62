"""Flags typed as people type them (issue 19 §5, issue 18 items 15 and 16): names from TRL,
verl and slime get the Relax flag, negative values parse as values, every numeric option
has a range and the validator answers every value with a problem, never an exception."""

import dataclasses
import math

import pytest
from typer.testing import CliRunner

from cli.main import app
from relax_core.config import RunConfig, _field_type, build_config, config_fields, param_flag, suggestion
from relax_core.host.plugins import default_registry
from relax_core.host.validation import resolve

runner = CliRunner()


@pytest.mark.parametrize("typed, want", [
    ("--learning-rate", "--lr"), ("--num-steps", "--num-rollout"), ("--max-steps", "--num-rollout"),
    ("--num-generations", "--n-samples-per-prompt"), ("--beta", "--kl-loss-coef"),
    ("--max-completion-length", "--rollout-max-response-len"), ("--temperature", "--rollout-temperature"),
    ("--hf-checkpoint", "--model"), ("--prompt-data", "--data"), ("--max-grad-norm", "--clip-grad"),
    ("--eps-clp", "--eps-clip"), ("--rollout-batchsize", "--rollout-batch-size"),
])
def test_unknown_flags_get_the_relax_name(typed, want):
    r = runner.invoke(app, ["train", "--dry-run", typed, "3"])
    assert r.exit_code == 2
    assert f"{typed} (did you mean '{want}'?" in r.stderr, r.stderr


def test_no_far_fetched_suggestions():
    r = runner.invoke(app, ["train", "--dry-run", "--learning-rate", "1e-5"])
    assert "--sglang-port" not in r.stderr and "--adam-eps" not in r.stderr
    assert suggestion("--frobnicate", ["--lr", "--seed"]) is None


@pytest.mark.parametrize("key, want", [("learning_rate", "lr"), ("actor_rollout_ref.rollout.n", "n_samples_per_prompt"),
                                       ("trainer.total_training_steps", "num_rollout"), ("eps_clp", "eps_clip")])
def test_unknown_yaml_keys_get_the_relax_name(tmp_path, key, want):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"{key}: 3\n")
    r = runner.invoke(app, ["train", "--dry-run", "--config", str(cfg)])
    assert r.exit_code == 2
    assert f"'{key}': unknown option (did you mean '{want}'?" in r.stderr, r.stderr


@pytest.mark.parametrize("argv, problem", [
    (["--lr", "-1e-5"], "--lr must be > 0, got -1e-05"),
    (["--eps-clip", "-0.2"], "--eps-clip must be >= 0, got -0.2"),
    (["--rollout-top-k", "-5"], "--rollout-top-k must be >= -1, got -5"),
    (["--m2po-kl2-budget", "-1"], "--m2po-kl2-budget must be >= 0, got -1.0"),
    (["--micro-batch-size", "0"], "--micro-batch-size must be >= 1, got 0"),
    (["--num-rollout", "-3"], "--num-rollout must be >= 1, got -3"),
])
def test_typed_values_reach_the_range_check(argv, problem):
    r = runner.invoke(app, ["train", "--dry-run", *argv])
    assert r.exit_code == 2, r.output
    assert problem in r.stderr and "Traceback" not in r.output and "expected one argument" not in r.stderr


def test_a_valid_negative_value_is_accepted():
    r = runner.invoke(app, ["train", "--dry-run", "--rollout-top-k", "-1", "--seed", "0"])
    assert r.exit_code == 0, r.output


def test_every_numeric_core_option_has_a_range():
    unbounded = [f.name for f in config_fields() if _field_type(f).replace("|None", "") in ("int", "float")
                 and all(f.metadata.get(k) is None for k in ("ge", "gt", "le", "lt"))]
    assert unbounded == []


def _numeric(schema_fields):
    return [f for f in schema_fields if _field_type(f).replace("|None", "") in ("int", "float")]


@pytest.mark.parametrize("value", [0, -1, 10**9, math.inf])
def test_validation_answers_any_numeric_value_without_raising(value):
    reg = default_registry()
    for f in _numeric(config_fields()):
        v = float(value) if _field_type(f).startswith("float") else (value if value != math.inf else 10**12)
        resolve(RunConfig(**{f.name: v}), reg)  # must not raise
    schemas = reg.param_schemas()
    for comp, schema in schemas.items():
        for pf in _numeric(dataclasses.fields(schema)):
            cfg = build_config(cli={f"{comp}.{pf.name}": value if value != math.inf or "float" in _field_type(pf)
                                    else 10**12}, param_schemas=schemas)
            resolve(cfg, reg)  # must not raise (problems are listed instead)
            assert param_flag(comp, pf).startswith("--")


def test_train_help_opens_with_a_short_usage_and_examples_and_lists_choices():
    r = runner.invoke(app, ["train", "--help"])
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert lines[0] == "usage: relax train [OPTIONS]"
    assert any(line.strip().startswith("relax train --data my.jsonl") for line in lines[:12])
    opening = lines[:lines.index("options:")]
    assert max(map(len, opening)) < 80, opening  # usage and examples fit an 80-column terminal
    text = r.stdout
    assert "--advantage-estimator, --estimator {cispo,gdpo,grpo,gspo,m2po,ppo,reinforce_plus_plus," in text
    for flag, names in (("--reward", "{auto,"), ("--correction", "{icepop,"), ("--loss-reduction", "{token-mean,"),
                        ("--kl-loss-type", "{k1,k2,k3,low_var_kl}"), ("--math-answer-format", "{boxed,anchors}")):
        assert f"{flag} {names}" in text, flag
    assert "--apply-chat-template, --no-apply-chat-template" in text and "(default: on)" in text
    assert "(default: off)" in text and "(default: None)" not in text
    assert "(--exclude-eval-prompts). (default: 'auto')" in " ".join(text.split())  # its help says "the default task"
    assert "\\\\\\\\" not in text and "\\\\boxed\\{.+\\}'" in text  # the regex as typed, not repr-escaped
    joined = " ".join(text.split())
    assert "(default: the instruction the data source declares" in joined
    assert "declares: 'Give only the final number.' for numeric rg: tasks, nothing for files). (default" not in joined


def test_plugins_show_explains_recommended_versus_default():
    r = runner.invoke(app, ["plugins", "show", "m2po"])
    assert r.exit_code == 0
    assert "the default is what runs" in r.stdout
    line = next(x for x in r.stdout.splitlines() if "--m2po-miniclip-low = 0.3" in x)
    assert "recommended 0.2 (default differs: 0.3 / 0.5 are the upstream Relax defaults" in line
