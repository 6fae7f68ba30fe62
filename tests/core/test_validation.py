"""Startup validation: capabilities (declared, undeclared, violated), batch arithmetic,
every problem collected with component, distribution, capability and fix."""

import dataclasses

import pytest

from relax_core import CorrectionCapabilities, CorrectionSpec, DualClipParams, EstimatorCapabilities, param
from relax_core.config import RunConfig
from relax_core.host.capabilities import CAPABILITIES
from relax_core.host.validation import ValidationError, resolve, validate
from relax_core.specs import SPEC_TYPES
from relax_core_test_toys import BASE_CAPS, ToyParams, estimator, make_plugin

TOY = ("toy", make_plugin(estimator(caps=BASE_CAPS)), "relax-toy", "1.0")


def _problems(reg, **cfg):
    cfg.setdefault("advantage_estimator", "toy")
    _, problems = resolve(RunConfig(plugin_params={"toy": ToyParams()}, **cfg), reg)
    return problems


def test_valid_default_run(registry_with):
    assert _problems(registry_with(TOY)) == []
    assert validate(RunConfig(advantage_estimator="toy"), registry_with(TOY)).context.estimator.name == "toy"


def test_capability_violated_error_text_is_pinned(registry_with):
    strict = ("strict", make_plugin(estimator(caps=EstimatorCapabilities(sync_only=True, behaviour_numerator="log_probs"))),
              "relax-strict", "0.2.0")
    [p] = _problems(registry_with(strict), launcher="ray", fully_async=True, max_staleness=1)[:1]
    assert str(p) == (
        "estimator 'toy' (relax-strict 0.2.0) [sync_only]: toy is sync-only (on-policy updates only), but "
        "--fully-async is set; --max-staleness 1 lets it train on stale rollouts\n"
        "    fix: run synchronously: --max-staleness 0, no --fully-async, --num-steps-per-rollout 1, "
        "--update-weights-interval 1, and "
        "--global-batch-size = --rollout-batch-size × --n-samples-per-prompt; or pick an estimator with "
        "importance-ratio correction (grpo, m2po)")


def test_undeclared_capability_is_refused(registry_with):
    """A spec that declares nothing gets the conservative defaults: no CP, no async."""
    bare = ("bare", make_plugin(estimator()), "relax-bare", "0.0.1")
    problems = _problems(registry_with(bare), context_parallel_size=2, launcher="ray", fully_async=True)
    by_cap = {p.constraint: p for p in problems if p.component.startswith("estimator")}
    assert by_cap["supports_context_parallel"].message == (
        "toy does not support context parallelism, but --context-parallel-size is 2")
    assert by_cap["supports_fully_async"].message == "toy does not support --fully-async"
    assert "sync_only" in by_cap
    assert all(p.component == "estimator 'toy' (relax-bare 0.0.1)" for p in by_cap.values()
               if p.constraint in ("supports_context_parallel", "supports_fully_async", "sync_only"))


def test_undeclared_behaviour_numerator_refuses_corrections(registry_with):
    corr = CorrectionSpec(name="tis", summary="toy", source="tests", factory="x:y",
                          capabilities=CorrectionCapabilities(behaviour_numerators=frozenset({"old_log_probs"})))
    reg = registry_with(("bare", make_plugin(estimator())), ("tis", make_plugin(corr), "relax-tis", "1.0"))
    [p] = [p for p in _problems(reg, correction=("tis",)) if p.constraint == "behaviour_numerators"]
    assert p.message == "tis is not valid with estimator 'toy' whose behaviour numerator is undeclared (needs old_log_probs)"
    assert p.component == "correction 'tis' (relax-tis 1.0)"
    assert "rloo, or grpo --pg-loss-type reinforce" in p.fix


def test_sync_only_estimator_refused_in_async_mode(registry_with):
    reg = registry_with(("bare", make_plugin(estimator())))
    for cfg in ({"launcher": "ray", "fully_async": True, "max_staleness": 1}, {"num_steps_per_rollout": 2}):
        assert "sync_only" in {p.constraint for p in _problems(reg, **cfg)}, cfg
    assert "sync_only" not in {p.constraint for p in _problems(registry_with(TOY), launcher="ray", fully_async=True,
                                                                max_staleness=1)}


def test_min_group_size_and_reward_side_kl(registry_with):
    problems = _problems(registry_with(TOY), n_samples_per_prompt=1, rollout_batch_size=32, kl_coef=0.1)
    msgs = {p.constraint: p.message for p in problems}
    assert msgs["min_group_size"] == ("toy needs --n-samples-per-prompt >= 2 (got 1): its reward stage is "
                                      "undefined for a smaller group")
    assert msgs["uses_options"] == "toy does not read --kl-coef 0.1: set, it would be a silent no-op"


def test_an_option_no_selected_estimator_reads_is_refused(registry_with):
    """A plugin parameter that no selected component reads is refused (issue 18.17: m2po and
    dapo ignored --eps-clip silently); since the PPO-clip block is plugin parameters
    (issue 17), that rule refuses --eps-clip with an estimator that does not compose it."""
    clipper = ("clipper", make_plugin(estimator("clipper", caps=BASE_CAPS, params=DualClipParams)), "relax-clip", "1.0")
    reg = registry_with(TOY, clipper)
    set_ = {"toy": ToyParams(), "clipper": DualClipParams(eps_clip=0.3, eps_clip_high=0.28, eps_clip_c=3.0)}
    problems = [p for p in resolve(RunConfig(advantage_estimator="toy", plugin_params=set_), reg)[1]
                if p.constraint == "unread option"]
    assert [(p.component, p.message) for p in problems] == [
        ("config", f"{flag} is read by no selected component (it is a parameter of clipper): set, it would be a "
                   "silent no-op") for flag in ("--eps-clip 0.3", "--eps-clip-c 3.0", "--eps-clip-high 0.28")]
    assert problems[0].fix == "drop it (or set it to its default), or select a component that reads it"
    selected = resolve(RunConfig(advantage_estimator="clipper", plugin_params=set_), reg)[1]
    assert "unread option" not in {p.constraint for p in selected}           # clipper reads them
    defaults = {"toy": ToyParams(), "clipper": DualClipParams()}
    assert "unread option" not in {p.constraint for p in resolve(RunConfig(advantage_estimator="toy",
                                                                           plugin_params=defaults), reg)[1]}


def test_a_shared_flag_is_read_when_any_selected_component_declares_it(registry_with):
    """Two components sharing a flag keep their own defaults: the unselected one's value
    differs from its default, but the flag is read by the selected one."""
    other = ("other", make_plugin(estimator("other", caps=BASE_CAPS, params=OtherBeta)), "relax-other", "1.0")
    cfg = RunConfig(advantage_estimator="toy", plugin_params={"toy": ToyParams(beta=0.2), "other": OtherBeta(beta=0.2)})
    assert "unread option" not in {p.constraint for p in resolve(cfg, registry_with(TOY, other))[1]}


@dataclasses.dataclass(frozen=True)
class OtherBeta:
    beta: float = param(0.9, "Shares --toy-beta.", flag="--toy-beta")


@pytest.mark.parametrize("cfg,messages", [
    ({"num_steps_per_rollout": 3},
     ["rollout_batch_size × n_samples_per_prompt = 4×8 = 32 samples per rollout is not divisible by "
      "--num-steps-per-rollout 3"]),
    ({"global_batch_size": 16},
     ["--global-batch-size 16 × --num-steps-per-rollout 1 = 16 != 32 samples per rollout "
      "(rollout_batch_size × n_samples_per_prompt = 4×8)"]),
    ({"global_batch_size": 16, "num_steps_per_rollout": 2}, []),
    ({"launcher": "ray", "actor_num_gpus_per_node": 3},
     ["--global-batch-size 32 is not divisible by the 3 data-parallel training workers"]),
    ({"launcher": "ray", "actor_num_gpus_per_node": 2, "micro_batch_size": 3},
     ["each training worker's share of the global batch (32 / 2 = 16 samples) is not divisible by "
      "--micro-batch-size 3"]),
    ({"launcher": "ray", "actor_num_gpus_per_node": 2, "micro_batch_size": 4}, []),
    ({"max_tokens_per_micro_batch": 32, "rollout_max_response_len": 64},
     ["--max-tokens-per-micro-batch 32 cannot hold one full-length response (--rollout-max-response-len 64, "
      "plus its prompt)"]),
])
def test_batch_shape_arithmetic(registry_with, cfg, messages):
    got = [p.message for p in _problems(registry_with(TOY), **cfg) if p.constraint == "batch shape"]
    assert got == messages


def test_every_problem_is_collected(registry_with):
    reg = registry_with(("bare", make_plugin(estimator())))
    with pytest.raises(ValidationError) as e:
        validate(RunConfig(advantage_estimator="toy", entropy_coef=-1.0, num_steps_per_rollout=3,
                           context_parallel_size=2, rollout_engine="vllm",
                           plugin_params={"toy": ToyParams(beta=7.0)}), reg)
    constraints = [p.constraint for p in e.value.problems]
    assert constraints.count("value range") == 2        # --entropy-coef and --toy-beta
    assert "batch shape" in constraints
    assert "unknown component" in constraints           # engine 'vllm'
    assert "supports_context_parallel" in constraints
    assert "sync_only" in constraints                   # num_steps_per_rollout 3
    for p in e.value.problems:
        assert p.fix or p.constraint == "value range", p
    assert str(e.value).count("\n    fix: ") == sum(1 for p in e.value.problems if p.fix)


def test_capability_table_covers_every_declared_capability():
    """Every capability field of every spec kind has one row in the table, and back."""
    table = {(c.kind, c.field) for c in CAPABILITIES}
    for kind, cls in SPEC_TYPES.items():
        if cls.capabilities_type is None:
            continue
        fields = {f for f in cls.capabilities_type.__dataclass_fields__}
        assert {(kind, f) for f in fields} <= table, kind
    assert len(table) == len(CAPABILITIES)


def test_data_sources(registry_with, tmp_path):
    from relax_core_test_toys import qa_plugin

    reg = registry_with(TOY, qa_plugin())  # rg: from the infra plugin, the file format qa: from the other
    f = tmp_path / "train.jsonl"
    f.write_text("{}\n")
    data = {p.message for p in _problems(reg, data="rg:basic_arithmetic?size=4") if p.constraint == "--data"}
    assert data == set()
    for value, message in ((str(f), None), (f"qa:{f}", None),
                           ("hf:gsm8k", "unknown data source scheme 'hf:' in hf:gsm8k"),
                           (str(tmp_path / "missing.jsonl"), f"data file {tmp_path / 'missing.jsonl'} not found"),
                           ("qa:/no/such.jsonl", "data file /no/such.jsonl not found")):
        got = [p.message for p in _problems(reg, data=value) if p.constraint == "--data"]
        assert got == ([message] if message else []), value
    [fix] = [p.fix for p in _problems(reg, data="qa:/no/such.jsonl") if p.constraint == "--data"]
    assert fix == "give an existing JSONL/JSON/Parquet file, qa:<file>, or a data source (`relax plugins`)"


def test_update_weights_interval_makes_a_run_off_policy(registry_with):
    strict = ("strict", make_plugin(estimator(caps=EstimatorCapabilities(sync_only=True, behaviour_numerator="log_probs"))),
              "relax-strict", "0.2.0")
    [p] = [p for p in _problems(registry_with(strict), update_weights_interval=3) if p.constraint == "sync_only"]
    assert "--update-weights-interval 3 generates with weights up to 2 steps old" in p.message
    assert not [p for p in _problems(registry_with(strict)) if p.constraint == "sync_only"]


def test_fully_async_staleness_bound_must_cover_the_weight_update_interval(registry_with):
    """With weights pushed every u steps a sample can be u - 1 steps stale whatever the
    bound, so --max-staleness below u - 1 is refused (the async loop would wait forever for
    weights that are never posted)."""
    reg = registry_with(TOY)
    [p] = [p for p in _problems(reg, launcher="ray", fully_async=True, max_staleness=1, update_weights_interval=3)
           if p.component == "config"]
    assert p.message == ("--fully-async with --update-weights-interval 3 cannot keep --max-staleness 1: the engines "
                         "get new weights only every 3 steps, so samples are up to 2 steps stale")
    assert p.fix == "use --max-staleness 2 or more, or a smaller --update-weights-interval"
    for ok in (dict(max_staleness=2, update_weights_interval=3), dict(max_staleness=0, update_weights_interval=1)):
        assert not [p for p in _problems(reg, launcher="ray", fully_async=True, **ok) if p.component == "config"]


def test_several_greedy_samples_per_evaluation_prompt_are_refused(registry_with):
    """At --eval-temperature 0 (the default) every sample of a prompt is the same greedy
    response: asking for more than one is refused, with the fix; sampled, it is fine."""
    reg = registry_with(TOY)
    [p] = _problems(reg, n_samples_per_eval_prompt=4)
    assert p.constraint == "--n-samples-per-eval-prompt" and "same greedy response" in p.message
    assert "--eval-temperature above 0" in p.fix
    assert _problems(reg, n_samples_per_eval_prompt=4, eval_temperature=0.7) == []
    assert _problems(reg, n_samples_per_eval_prompt=4, eval_data="none") == []
