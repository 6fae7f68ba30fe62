"""Startup validation of environments: a multi-turn environment needs an engine that continues
from tokens and an estimator declared correct with holes in the loss mask (refused, exit 2,
naming the plugin and the fix); per-turn rewards with an estimator that ignores them warn;
a maximum context needs --max-episode-tokens; the environment kind in the CLI and docs."""

import dataclasses

import pytest
from typer.testing import CliRunner

import relax_core.host.plugins as plugins_mod
from cli.main import app
from relax_core import EngineCapabilities, EngineSpec, EnvironmentCapabilities, EnvironmentSpec
from relax_core.config import RunConfig
from relax_core.host.validation import resolve
from relax_core_test_toys import BASE_CAPS, estimator, make_plugin

HOLES = dataclasses.replace(BASE_CAPS, supports_loss_mask_holes=True)


def env(name, **caps):
    return EnvironmentSpec(name=name, summary="toy environment", source="tests", factory="x:y",
                           capabilities=EnvironmentCapabilities(**caps))


PLUGINS = [("toy", make_plugin(estimator(caps=BASE_CAPS), estimator("holes", caps=HOLES)), "relax-toy", "1.0"),
           ("envs", make_plugin(env("chat", multi_turn=True), env("graded", multi_turn=True, turn_rewards=True),
                                env("small", max_context=256)), "relax-envs", "0.2"),
           ("tokens", make_plugin(EngineSpec(name="tokens", summary="toy engine", source="tests", factory="x:y",
                                             capabilities=EngineCapabilities(
                                                 provides_fields=frozenset({"rollout_log_probs"}),
                                                 supports_weight_update=True, supports_token_continuation=True))),
            "relax-tokens", "0.3")]


@pytest.fixture
def reg(registry_with):
    return registry_with(*PLUGINS)


def _resolve(reg, **cfg):
    resolved, problems = resolve(RunConfig(**cfg), reg)
    return {p.constraint: p for p in problems}, resolved.warnings


def test_multi_turn_refuses_an_engine_without_token_continuation(reg):
    problems, _ = _resolve(reg, environment="chat", advantage_estimator="holes")
    p = problems["supports_token_continuation"]
    assert p.component == "engine 'hf' (relax-infra 1.0)"
    assert "cannot continue generation from token ids, which the episodes of multi-turn environment 'chat' need" \
        in p.message
    assert "--rollout-engine whose `token-in` column says yes" in p.fix and "--environment single_turn" in p.fix
    assert list(problems) == ["supports_token_continuation"]
    assert _resolve(reg, environment="chat", advantage_estimator="holes", rollout_engine="tokens") == ({}, ())


def test_multi_turn_refuses_an_estimator_without_mask_holes(reg):
    problems, _ = _resolve(reg, environment="chat", advantage_estimator="toy", rollout_engine="tokens")
    p = problems["supports_loss_mask_holes"]
    assert p.component == "estimator 'toy' (relax-toy 1.0)"
    assert "is not declared correct with holes in loss_mask" in p.message and "'chat'" in p.message
    assert "`mask holes` column" in p.fix
    assert list(problems) == ["supports_loss_mask_holes"]
    # single-turn episodes have no holes: the default environment needs neither declaration
    assert _resolve(reg, advantage_estimator="toy") == ({}, ())


def test_turn_rewards_with_an_estimator_that_ignores_them_warn(reg):
    problems, warnings = _resolve(reg, environment="graded", advantage_estimator="holes", rollout_engine="tokens")
    assert problems == {}
    (w,) = warnings
    assert w.constraint == "uses_turn_rewards" and w.component == "estimator 'holes' (relax-toy 1.0)"
    assert "trains on each episode's return, the sum of the turn rewards of environment 'graded'" in w.message


def test_max_context_needs_max_episode_tokens(reg):
    problems, _ = _resolve(reg, environment="small", advantage_estimator="toy")
    assert "designed for at most 256 tokens per episode" in problems["max_context"].message
    assert _resolve(reg, environment="small", advantage_estimator="toy", max_episode_tokens=256) == ({}, ())
    assert "max_context" in _resolve(reg, environment="small", advantage_estimator="toy", max_episode_tokens=257)[0]


def test_an_engine_context_limit_needs_bounded_episodes(registry_with):
    bounded = ("bounded", make_plugin(EngineSpec(
        name="bounded", summary="toy engine", source="tests", factory="x:y",
        capabilities=EngineCapabilities(provides_fields=frozenset({"rollout_log_probs"}), supports_weight_update=True,
                                        supports_token_continuation=True, max_context=512))), "relax-bounded", "0.4")
    reg = registry_with(*PLUGINS, bounded)
    run = dict(environment="chat", advantage_estimator="holes", rollout_engine="bounded")
    p = _resolve(reg, **run)[0]["max_context"]
    assert p.component == "engine 'bounded' (relax-bounded 0.4)"
    assert "accepts at most 512 tokens of prompt + response" in p.message and "only by --max-turns" in p.message
    assert "leaves no room for the prompt" in _resolve(reg, **run, max_episode_tokens=512)[0]["max_context"].message
    assert _resolve(reg, **run, max_episode_tokens=400) == ({}, ())
    assert _resolve(reg, advantage_estimator="holes", rollout_engine="bounded") == ({}, ())  # single turn: unchecked


def test_vllm_declares_its_model_length():
    vllm = pytest.importorskip("relax_vllm.plugin")
    spec = vllm.relax_register_rollout_engines()[0]
    assert spec.capabilities_for(spec.params(max_model_len=4096)).max_context == 4096
    assert spec.capabilities_for().supports_token_continuation


def test_cli_exits_2_naming_the_plugin_and_the_fix(reg, monkeypatch):
    monkeypatch.setattr(plugins_mod, "_DEFAULT", reg)
    r = CliRunner().invoke(app, ["train", "--dry-run", "--environment", "chat", "--estimator", "toy"])
    assert r.exit_code == 2
    assert "engine 'hf' (relax-infra 1.0) [supports_token_continuation]" in r.stderr
    assert "estimator 'toy' (relax-toy 1.0) [supports_loss_mask_holes]" in r.stderr
    assert "fix: choose an estimator whose `mask holes` column says yes" in r.stderr
    r = CliRunner().invoke(app, ["train", "--dry-run", "--environment", "graded", "--estimator", "holes",
                                 "--rollout-engine", "tokens"])
    assert "relax: warning: estimator 'holes' (relax-toy 1.0) [uses_turn_rewards]" in r.stderr
