"""Run configuration: YAML + flags precedence, unknown keys, coercion, value ranges."""

import dataclasses
import math

import pytest

from relax_core import DualClipParams, PPOClipParams
from relax_core.config import ConfigError, RunConfig, build_config, config_fields, load_yaml, parse_cli, value_problems
from relax_core_test_toys import ToyParams

SCHEMAS = {"toy": ToyParams, "clip": DualClipParams}  # the PPO-clip block: --eps-clip, ...


def _build(tmp_path, yaml_text, argv):
    path = tmp_path / "run.yaml"
    path.write_text(yaml_text)
    cli, config_path, _ = parse_cli(argv + ["--config", str(path)], SCHEMAS)
    return build_config(cli=cli, yaml_values=load_yaml(config_path), param_schemas=SCHEMAS)


def test_yaml_and_flags_precedence(tmp_path):
    cfg = _build(tmp_path, "eps_clip: 0.3\nkl-loss-coef: 0.01\nn_samples_per_prompt: 4\ntoy_beta: 0.25\n"
                           "correction: [tis]\n",
                 ["--eps-clip", "0.1", "--toy-beta", "0.75", "--estimator", "rloo"])
    assert cfg.plugin_params["clip"].eps_clip == 0.1  # flag beats YAML (a block's flag: --eps-clip)
    assert cfg.kl_loss_coef == 0.01       # YAML beats default (dashes accepted)
    assert cfg.n_samples_per_prompt == 4
    assert cfg.advantage_estimator == "rloo"  # alias --estimator
    assert cfg.plugin_params["toy"] == ToyParams(beta=0.75, mode="a")  # plugin flag beats YAML
    assert cfg.correction == ("tis",)
    assert cfg.rollout_batch_size == RunConfig().rollout_batch_size  # default kept


def test_nested_plugin_params_in_yaml(tmp_path):
    cfg = _build(tmp_path, "toy:\n  mode: b\n  beta: 0.1\n", [])
    assert cfg.plugin_params["toy"] == ToyParams(beta=0.1, mode="b")


def test_unknown_yaml_key_is_an_error_with_the_closest_key(tmp_path):
    with pytest.raises(ConfigError) as e:
        _build(tmp_path, "eps_clp: 0.3\nn_sample_per_prompt: 4\ntoy:\n  bta: 1\nzzz_qqq: 1\n", [])
    assert e.value.problems == [
        "config: 'eps_clp': unknown option (did you mean 'eps_clip'?)",
        "config: 'n_sample_per_prompt': unknown option (did you mean 'n_samples_per_prompt'?)",
        "config: 'toy': unknown parameter 'bta' of toy (did you mean 'beta'?)",
        "config: 'zzz_qqq': unknown option",
    ]


def test_wrong_types_are_errors(tmp_path):
    with pytest.raises(ConfigError) as e:
        _build(tmp_path, "n_samples_per_prompt: 2.5\nnormalize_advantages: maybe\neps_clip: abc\n", [])
    assert e.value.problems == [
        "config: 'n_samples_per_prompt': expected an integer, got 2.5",
        "config: 'normalize_advantages': expected true/false, got 'maybe'",
        "config: 'eps_clip': expected a number, got 'abc'",
    ]


def test_yaml_file_problems(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_yaml(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_yaml(tmp_path / "list.yaml")


def test_unknown_flag_exits_2_with_a_suggestion(capsys):
    with pytest.raises(SystemExit) as e:
        parse_cli(["--eps-clipp", "0.1"], SCHEMAS)
    assert e.value.code == 2
    assert "unknown option(s): --eps-clipp (did you mean '--eps-clip'?)" in capsys.readouterr().err


@pytest.mark.parametrize("field,value,problem", [
    ("entropy_coef", -0.1, "--entropy-coef must be >= 0, got -0.1"),
    ("entropy_coef", math.nan, "--entropy-coef must be finite, got nan"),
    ("kl_coef", math.inf, "--kl-coef must be finite, got inf"),
    ("lr", 0.0, "--lr must be > 0, got 0.0"),
    ("rollout_top_p", 1.5, "--rollout-top-p must be <= 1, got 1.5"),
    ("loss_norm_constant", 0.0, "--loss-norm-constant must be > 0, got 0.0"),
    ("n_samples_per_prompt", 0, "--n-samples-per-prompt must be >= 1, got 0"),
    ("loss_reduction", "mean", "--loss-reduction must be one of token-mean, seq-mean-token-mean, "
                               "seq-mean-token-sum, seq-mean-token-sum-norm, got 'mean'"),
    ("kl_loss_type", "low_var", "--kl-loss-type must be one of k1, k2, k3, low_var_kl, got 'low_var' "
                                "(did you mean 'low_var_kl'?)"),
])
def test_value_ranges_of_core_options(field, value, problem):
    assert value_problems(RunConfig(**{field: value})) == [problem]


@pytest.mark.parametrize("params,problem", [
    (ToyParams(beta=-1.0), "toy: --toy-beta must be >= 0, got -1.0"),
    (ToyParams(beta=2.0), "toy: --toy-beta must be <= 1, got 2.0"),
    (ToyParams(beta=math.nan), "toy: --toy-beta must be finite, got nan"),
    (ToyParams(mode="c"), "toy: --toy-mode must be one of a, b, got 'c'"),
    (DualClipParams(eps_clip=-0.1), "toy: --eps-clip must be >= 0, got -0.1"),
    (DualClipParams(eps_clip_c=1.0), "toy: --eps-clip-c must be > 1, got 1.0"),
])
def test_value_ranges_of_plugin_params(params, problem):
    assert value_problems(RunConfig(plugin_params={"toy": params})) == [problem]


def test_a_shared_flag_out_of_range_is_reported_once_naming_its_components():
    """--eps-clip -1 sets the block of every estimator composing it: one problem, not one each."""
    bad = PPOClipParams(eps_clip=-1.0)
    assert value_problems(RunConfig(plugin_params={"b": bad, "a": DualClipParams(eps_clip=-1.0)})) == [
        "a, b: --eps-clip must be >= 0, got -1.0"]


def test_defaults_are_in_range_and_every_option_is_documented():
    assert value_problems(RunConfig(plugin_params={"toy": ToyParams()})) == []
    for f in config_fields():
        assert f.metadata["help"].strip(), f.name


def test_flags_named_as_relax():
    from relax_core.config import flag_of

    flags = {flag_of(f) for f in config_fields()} | {a for f in config_fields() for a in f.metadata["aliases"]}
    for flag in ("--advantage-estimator", "--estimator", "--n-samples-per-prompt", "--rollout-batch-size",
                 "--global-batch-size", "--num-steps-per-rollout", "--num-rollout", "--max-staleness",
                 "--fully-async", "--context-parallel-size", "--tensor-parallel-size",
                 "--calculate-per-token-loss", "--normalize-advantages", "--disable-rewards-normalization",
                 "--kl-coef", "--use-kl-loss", "--kl-loss-coef", "--kl-loss-type", "--ref-load",
                 "--entropy-coef", "--use-rollout-logprobs", "--correction",
                 "--reward", "--reward-processor", "--rollout-engine", "--train-backend", "--model", "--data",
                 "--output-dir", "--seed", "--rollout-temperature", "--rollout-top-p", "--rollout-top-k",
                 "--rollout-max-response-len"):
        assert flag in flags, flag
    from relax_core.config import param_flag

    assert [param_flag("grpo", f) for f in dataclasses.fields(DualClipParams)] == [  # a block's, same names
        "--eps-clip", "--eps-clip-high", "--eps-clip-c"]


def test_plugin_flag_colliding_with_a_core_flag_is_an_error():
    from dataclasses import dataclass

    from relax_core import param

    @dataclass(frozen=True)
    class Clash:
        eps: float = param(0.1, "clashes", flag="--entropy-coef")

    with pytest.raises(ConfigError, match="--entropy-coef of plugin parameter bad.eps collides with the core option"):
        parse_cli([], {"bad": Clash})
    with pytest.raises(ConfigError, match="collides with the core option --entropy-coef"):
        build_config(param_schemas={"bad": Clash})


def test_two_plugins_may_share_a_flag():
    from dataclasses import dataclass

    from relax_core import param

    @dataclass(frozen=True)
    class A:
        gamma: float = param(1.0, "discount", flag="--gamma")

    @dataclass(frozen=True)
    class B:
        gamma: float = param(0.5, "discount", flag="--gamma")

    schemas = {"a": A, "b": B}
    cli, _, _ = parse_cli(["--gamma", "0.9"], schemas)
    cfg = build_config(cli=cli, param_schemas=schemas)
    assert (cfg.plugin_params["a"].gamma, cfg.plugin_params["b"].gamma) == (0.9, 0.9)
    assert build_config(param_schemas=schemas).plugin_params["b"].gamma == 0.5  # each keeps its default


def test_runtime_annotations_of_plugin_params_are_coerced():
    """Plugin modules without ``from __future__ import annotations`` (typing objects)."""
    ns = {}
    exec("from dataclasses import dataclass\n"
         "from typing import Literal, Optional\n"
         "from relax_core import param\n"
         "@dataclass(frozen=True)\n"
         "class P:\n"
         "    a: Optional[float] = param(None, 'a')\n"
         "    b: float | None = param(None, 'b')\n"
         "    c: Literal['x', 'y'] = param('x', 'c', choices=('x', 'y'))\n"
         "    d: int = param(1, 'd')\n"
         "    e: bool = param(False, 'e')\n", ns)
    schemas = {"p": ns["P"]}
    cli, _, _ = parse_cli(["--p-a", "0.5", "--p-b", "2", "--p-c", "y", "--p-d", "3", "--p-e"], schemas)
    assert build_config(cli=cli, param_schemas=schemas).plugin_params["p"] == ns["P"](a=0.5, b=2.0, c="y", d=3, e=True)


def test_plugin_bool_defaulting_to_true_has_a_no_flag():
    from dataclasses import dataclass

    from relax_core import param

    @dataclass(frozen=True)
    class P:
        on: bool = param(True, "on by default")

    schemas = {"p": P}
    cli, _, _ = parse_cli(["--no-p-on"], schemas)
    assert build_config(cli=cli, param_schemas=schemas).plugin_params["p"].on is False
    cli, _, _ = parse_cli([], schemas)
    assert build_config(cli=cli, param_schemas=schemas).plugin_params["p"].on is True
