"""The plugin host: broken plugins, duplicates, selection by environment, hook checks."""

import dataclasses

import pytest

from relax_core import DataSourceSpec, EstimatorSpec, RewardScorerSpec, hookimpl
from relax_core.config import RunConfig
from relax_core.host.plugins import PluginError, load_registry
from relax_core.host.validation import resolve
from relax_core_test_toys import BASE_CAPS, ToyParams, estimator, make_plugin

BROKEN = ("broken", "relax_core_test_no_such_module", "relax-broken", "0.3.1")


def test_broken_plugin_is_recorded_and_others_still_load(registry_with):
    reg = registry_with(BROKEN, ("toy", make_plugin(estimator(caps=BASE_CAPS)), "relax-toy", "1.0"))
    info = {p.name: p for p in reg.plugins}
    assert info["broken"].status == "error"
    assert (info["broken"].dist, info["broken"].version) == ("relax-broken", "0.3.1")
    assert info["broken"].error == "ModuleNotFoundError: No module named 'relax_core_test_no_such_module'"
    assert info["toy"].status == "ok" and reg.names("estimator") == ["toy"]


def test_selecting_a_component_of_a_broken_plugin_fails_with_its_error(registry_with):
    reg = registry_with(BROKEN)
    _, problems = resolve(RunConfig(advantage_estimator="broken"), reg)
    [p] = [p for p in problems if p.component == "estimator 'broken'"]
    assert "plugin 'broken' (relax-broken 0.3.1) failed to load: ModuleNotFoundError" in p.message


def test_strict_mode_fails_on_a_broken_plugin(registry_with, monkeypatch):
    monkeypatch.setenv("RELAX_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match=r"plugin 'broken' \(relax-broken 0.3.1\) failed to load: ModuleNotFoundError"):
        registry_with(BROKEN)
    monkeypatch.setenv("RELAX_STRICT_PLUGINS", "0")
    assert registry_with(BROKEN).plugins[1].status == "error"


def test_duplicate_name_names_both_distributions(registry_with):
    reg = registry_with(("a", make_plugin(estimator(caps=BASE_CAPS)), "relax-toy", "1.0"),
                        ("b", make_plugin(estimator(caps=BASE_CAPS)), "relax-toy-fork", "2.0"))
    assert reg.problems == [
        "estimator 'toy' is registered by two distributions: relax-toy 1.0 (plugin 'a') and "
        "relax-toy-fork 2.0 (plugin 'b'). Uninstall one, or disable one with RELAX_DISABLE_PLUGINS=b"]
    _, problems = resolve(RunConfig(advantage_estimator="toy"), reg)
    assert any("relax-toy 1.0" in p.message and "relax-toy-fork 2.0" in p.message for p in problems)
    with pytest.raises(PluginError, match="registered by two distributions"):
        load_registry([("a", make_plugin(estimator()), "relax-toy", "1"), ("b", make_plugin(estimator()), "relax-fork", "1")],
                      entry_points=False, strict=True)


def test_components_of_two_kinds_sharing_a_name_may_not_both_take_parameters(registry_with):
    """Flags and YAML address plugin parameters by component name (``--toy-beta``,
    ``toy: {beta: ...}``): an estimator and a scorer both named 'toy' would share them."""
    from relax_core import RewardScorerSpec

    scorer = RewardScorerSpec(name="toy", summary="toy scorer", source="tests", factory="m:f", params=ToyParams)
    reg = registry_with(("a", make_plugin(estimator(caps=BASE_CAPS)), "relax-toy", "1.0"),
                        ("b", make_plugin(scorer), "relax-toy-reward", "2.0"))
    assert reg.problems == [
        "reward 'toy' (relax-toy-reward 2.0) and estimator 'toy' (relax-toy 1.0) both take parameters, which flags "
        "and YAML address by component name: rename one, or disable one with RELAX_DISABLE_PLUGINS=b"]
    assert "toy" not in reg.names("reward")
    plain = dataclasses.replace(scorer, params=None)  # without parameters the names do not clash
    assert registry_with(("a", make_plugin(estimator(caps=BASE_CAPS)), "relax-toy", "1.0"),
                         ("b", make_plugin(plain), "relax-toy-reward", "2.0")).problems == []


@pytest.mark.parametrize("var,value,loaded", [
    ("RELAX_LOAD_PLUGINS", "one", {"one"}),
    ("RELAX_LOAD_PLUGINS", "relax-two, infra", {"two", "infra"}),  # distribution names work too
    ("RELAX_DISABLE_PLUGINS", "one", {"two", "infra"}),
    ("RELAX_DISABLE_PLUGINS", "relax-one,relax-two", {"infra"}),
])
def test_environment_selects_plugins(registry_with, monkeypatch, var, value, loaded):
    monkeypatch.setenv(var, value)
    reg = registry_with(("one", make_plugin(estimator("one")), "relax-one", "1"),
                        ("two", make_plugin(estimator("two")), "relax-two", "1"))
    assert {p.name for p in reg.plugins if p.status == "ok"} == loaded
    assert {p.name for p in reg.plugins if p.status == "disabled"} == {"infra", "one", "two"} - loaded
    assert set(reg.names("estimator")) == loaded - {"infra"}
    if "one" not in loaded:
        with pytest.raises(PluginError, match=r"not loaded \(RELAX_LOAD_PLUGINS / RELAX_DISABLE_PLUGINS\): .*one"):
            reg.get("estimator", "one")


def test_misspelled_hook_is_caught_with_a_suggestion(registry_with):
    bad = make_plugin(relax_register_estimator=hookimpl(lambda: [estimator()]))
    reg = registry_with(("typo", bad))
    assert reg.plugins[1].status == "error"
    assert reg.plugins[1].error == ("ValueError: unknown hook 'relax_register_estimator' "
                                    "(did you mean 'relax_register_estimators'?)")


def test_hook_without_hookimpl_marker_is_caught(registry_with):
    reg = registry_with(("nomark", make_plugin(relax_register_estimators=lambda: [estimator()])))
    assert reg.plugins[1].error == "ValueError: 'relax_register_estimators' is not marked with @relax_core.hookimpl"


def test_hook_with_wrong_signature_is_caught(registry_with):
    reg = registry_with(("sig", make_plugin(relax_register_estimators=hookimpl(lambda config: [estimator()]))))
    assert reg.plugins[1].status == "error" and "config" in reg.plugins[1].error


def test_unsupported_api_version_is_refused(registry_with):
    reg = registry_with(("future", make_plugin(estimator(api_version=6)), "relax-future", "9.0"))
    assert reg.plugins[1].status == "error"
    assert reg.plugins[1].error == (
        "ValueError: estimator 'toy' declares api_version 6; this relax-core supports [1, 2, 3, 4, 5]: upgrade "
        "relax-core or install a version of relax-future written for it")
    assert reg.names("estimator") == []


def test_api_version_1_loads_where_the_contract_kept_its_names_only():
    from relax_core.specs import api_version_problem

    for kind in ("reward", "reward_processor", "data_source"):
        assert all(api_version_problem(kind, v) is None for v in (1, 2, 3, 4, 5))
    for kind in ("engine", "backend", "estimator", "correction"):
        assert "no longer load" in api_version_problem(kind, 1)
    assert api_version_problem("engine", 2) is None
    assert "since api_version 3 the core owns the optimizer step" in api_version_problem("backend", 2)
    assert api_version_problem("backend", 3) is None
    assert api_version_problem("estimator", 3) == (   # the clip block, and the fact corrections read
        "api_version 3 estimators no longer load: since api_version 4 the PPO-clip options are a parameter block: "
        "compose relax_core.PPOClipParams (or DualClipParams for --eps-clip-c) in your parameters and read "
        "params.eps_clip (RunConfig.eps_clip, eps_clip_high, eps_clip_c are gone, and uses_options no longer lists "
        "them); policy_loss_kind is replaced by behaviour_numerator (old_log_probs for a loss with a ratio to the old "
        "policy, log_probs for one without) (docs/guide/writing-plugins.md)")
    assert "since api_version 4 compatible_policy_loss_kinds is replaced by behaviour_numerators" in (
        api_version_problem("correction", 3))
    assert api_version_problem("correction", 4) is None
    assert api_version_problem("estimator", 4) is None


def test_a_scorer_written_for_api_4_that_fails_to_build_is_told_where_answers_went():
    from relax_core.specs import api_notes

    assert api_notes("reward", 4).startswith(" (written for plugin API 4; since 5: relax_core.answers is now the "
                                             "library relax_answers (distribution relax-answers)")
    assert api_notes("reward", 5) == "" and api_notes("estimator", 4) == ""
    from relax_core.stages.rewarding import RewardSetupError, Scorer

    old = RewardScorerSpec(name="old", summary="s", source="s", factory="relax_core.answers:last_boxed", api_version=4)
    with pytest.raises(RewardSetupError, match=r"reward scorer 'old' cannot be built: ModuleNotFoundError: .*"
                                               r"\(written for plugin API 4; since 5: relax_core.answers is now"):
        Scorer({"old": old}, reward="old").check([{}])


@pytest.mark.parametrize("spec,error", [
    (lambda: estimator(name="Bad-Name"), "component name 'Bad-Name' must match [a-z][a-z0-9_]*"),
    (lambda: estimator(params=dict), "params must be a dataclass"),
    (lambda: estimator(caps=object()), "capabilities must be a EstimatorCapabilities or a callable"),
    (lambda: EstimatorSpec(name="toy", summary="s", source="s", factory="no_colon"), "factory must be 'package.module:callable'"),
    (lambda: DataSourceSpec(name="qa", scheme="qa", summary="s", source="s", factory="m:f", file_keys="question"),
     "data_source 'qa': file_keys must be a tuple of non-empty strings, got 'question'"),
    (lambda: RewardScorerSpec(name="r", summary="s", source="s", factory="m:f", auto_labels="no_colon"),
     "reward 'r': auto_labels must be 'package.module:predicate', got 'no_colon'"),
    (lambda: RewardScorerSpec(name="r", summary="s", source="s", factory="m:f", fixes="--one-fix"),
     "reward 'r': fixes must be a tuple of non-empty strings, got '--one-fix'"),
    (lambda: RewardScorerSpec(name="r", summary="s", source="s", factory="m:f", suggest=("--reward r",)),
     "reward 'r': suggest must be a string, got ('--reward r',)"),
])
def test_malformed_spec_is_refused(registry_with, spec, error):
    reg = registry_with(("bad", make_plugin(spec())))
    assert reg.plugins[1].status == "error" and error in reg.plugins[1].error


def test_wrong_spec_type_for_hook(registry_with):
    p = make_plugin(relax_register_corrections=hookimpl(lambda: [estimator()]))
    reg = registry_with(("wrong", p))
    assert reg.plugins[1].error == "TypeError: relax_register_corrections returned EstimatorSpec, expected CorrectionSpec"


def test_unknown_component_suggests_the_closest(registry_with):
    reg = registry_with(("toy", make_plugin(estimator("rloo"))))
    with pytest.raises(PluginError, match=r"unknown estimator 'rlooo'. Available: rloo. Did you mean 'rloo'\?"):
        reg.get("estimator", "rlooo")


def test_capabilities_may_depend_on_parameters(registry_with):
    from relax_core import EstimatorCapabilities
    from relax_core_test_toys import ToyParams

    spec = estimator(caps=lambda p: EstimatorCapabilities(supports_context_parallel=p.mode == "b"))
    assert spec.capabilities_for().supports_context_parallel is False
    assert spec.capabilities_for(ToyParams(mode="b")).supports_context_parallel is True


def test_installed_plugins_all_load():
    """Every plugin installed from this repository loads, and no name is registered twice."""
    reg = load_registry()
    broken = [f"{p.name} ({p.dist} {p.version}): {p.error}" for p in reg.plugins if p.status != "ok"]
    assert broken == [] and reg.problems == []
    assert "grpo" in reg.names("estimator")  # the default estimator is installed


def test_every_kind_is_named_once_and_has_its_hook():
    """specs.KINDS is the one list of kinds: each has a documented hookspec and a spec type
    of that kind, and the loader, matrix, docs and scaffold read it."""
    from relax_authoring.docgen import KIND_DIRS
    from relax_authoring.scaffold import KINDS as SCAFFOLD_KINDS
    from relax_core import hookspecs
    from relax_core.specs import KINDS

    hooks = {name for name in dir(hookspecs) if name.startswith("relax_register_")}
    assert hooks == {k.hook for k in KINDS}
    for k in KINDS:
        assert k.spec_type.kind == k.name and getattr(hookspecs, k.hook).__doc__
    names = [k.name for k in KINDS]
    assert list(KIND_DIRS) == names
    from relax_core.config import RunConfig

    # each selecting flag is a config field (the CLI's choices come from Kind.option)
    assert all(k.option in RunConfig.__dataclass_fields__ for k in KINDS if k.option)
    assert set(SCAFFOLD_KINDS) == set(names) - {"data_source"}
