"""relax-llm-judge: the verdict parser and the judge prompt (by hand), the contract kit and
determinism on the tiny random model through the ``hf`` engine plugin, one ``generate`` call
per batch and invalid verdicts unscored and counted (a scripted engine), the counts through
the reward workers, and the startup refusals."""

import importlib.metadata as md
import types

import pytest

from relax_authoring.testing import check_contract
from relax_core import EngineCapabilities, EngineSpec, hookimpl
from relax_core.config import RunConfig
from relax_llm_judge.plugin import LLMJudgeParams, parse_verdicts, relax_register_reward_scorers
from relax_llm_judge.scorer import LLMJudge

SPEC = relax_register_reward_scorers()[0]


def test_verdict_words_and_template_problems():
    assert parse_verdicts(" Yes:1, no:0 ,partly:0.5") == {"yes": 1.0, "no": 0.0, "partly": 0.5}
    for bad in ("yes", "yes:1,yes:0", "", "two words:1"):
        with pytest.raises(ValueError):
            parse_verdicts(bad)
    assert LLMJudgeParams().problems() == []
    msgs = " | ".join(m for m, _ in LLMJudgeParams(verdicts="yes", template="{answer} {response}").problems())
    assert "--llm-judge-verdicts 'yes'" in msgs and "names {answer}" in msgs
    assert "has no {response}" in LLMJudgeParams(template="{reference}").problems()[0][0]


class ScriptedEngine:
    """Replies 'Yes.' when the response shown holds the reference, 'No' when not, and
    'hmm' (no verdict word) when the response says 'unsure'; records its calls."""

    def __init__(self, tokenizer):
        self.tok, self.calls = tokenizer, []

    def generate(self, prompt_ids, sampling):
        self.calls.append((len(prompt_ids), sampling))
        texts = [self.tok.decode(ids) for ids in prompt_ids]
        replies = []
        for t in texts:
            ref = t.split("Reference answer: ")[1].split("\n")[0]
            shown = t.split("Student's response:\n")[1].split("\n\n")[0]
            replies.append("hmm" if "unsure" in shown else "Yes." if ref in shown else "No")
        return types.SimpleNamespace(responses=replies)


def scripted_registry():
    from relax_core.host.plugins import load_registry

    holder = {}

    def build(params, config):
        from relax_core.models import load_tokenizer

        holder["engine"] = ScriptedEngine(load_tokenizer(config.model))
        return holder["engine"]

    mod = types.ModuleType("scripted_engine")
    mod.build = build
    import sys

    sys.modules["scripted_engine"] = mod
    mod.relax_register_rollout_engines = hookimpl(lambda: [EngineSpec(
        name="scripted", summary="test", source="test", factory="scripted_engine:build",
        capabilities=EngineCapabilities(devices=frozenset({"cpu"})))])
    return load_registry([("scripted", mod)], entry_points=False), holder


def test_one_generate_call_per_batch_and_invalid_verdicts_are_unscored_and_counted():
    reg, holder = scripted_registry()
    judge = LLMJudge(LLMJudgeParams(engine="scripted"), RunConfig(), registry=reg)
    got = judge(["3 + 4 = 7", "it is 8", "unsure, maybe 7", ""], ["7", "7", "7", "7"], [{}] * 4)
    assert got == [1.0, 0.0, None, 0.0]  # 'hmm' is unscored, never 0
    assert judge.pop_counts() == {"invalid": 1} and judge.pop_counts() == {"invalid": 0}
    (n, sampling), = holder["engine"].calls
    assert n == 4 and sampling.temperature == 0 and sampling.max_new_tokens == 8
    assert judge([], [], []) == [] and len(holder["engine"].calls) == 1


def test_judge_prompt_fills_the_template_and_keeps_the_responses_end():
    reg, _ = scripted_registry()
    p = LLMJudgeParams(engine="scripted", template="Q: {prompt} R: {response} A: {reference}", max_response_chars=5)
    judge = LLMJudge(p, RunConfig(), registry=reg)
    text = judge.judge_prompt("long answer 42", 42, {"prompt": "6*7?"})
    assert "Q: 6*7? R: er 42 A: 42" in text and text.startswith("<|im_start|>")  # SmolLM2's chat template
    assert judge.verdict("NO, it is wrong; yes") == 0.0 and judge.verdict("noted") is None  # first whole word


def test_contract_and_determinism_on_the_tiny_model(tiny_model_dir):
    params = LLMJudgeParams(model=str(tiny_model_dir), max_new_tokens=4)
    check_contract(SPEC, params)  # a sample's verdict does not depend on its batch-mates
    judge = LLMJudge(params, RunConfig())
    rs, labs = ["The answer is 42.", "7", ""], ["42", "8", "1"]
    first = judge.replies(rs, labs, [{}] * 3)
    assert judge.replies(rs, labs, [{}] * 3) == first  # greedy: the same reply every time


def test_invalid_counts_reach_the_step_metrics_through_the_reward_workers(tiny_model_dir):
    from relax_core.host.plugins import default_registry
    from relax_core.run.launch import make_score
    from relax_core.stages.reward_mix import step_metrics
    from relax_core.stages.rewarding import resolve_scorers, shutdown_pools

    # a random model never writes this word: every verdict is invalid
    cfg = RunConfig(reward=("llm_judge",), reward_timeout=120, reward_num_workers=1, plugin_params={
        "llm_judge": LLMJudgeParams(model=str(tiny_model_dir), verdicts="zyzzyva:1", max_new_tokens=2)})
    score = make_score(resolve_scorers(cfg, default_registry()), cfg)
    try:
        rewards, metrics = score(["a", "b", "c"], ["1", "2", "3"], [{}] * 3, ["p"] * 3)
    finally:
        shutdown_pools()
    assert rewards == [None, None, None]
    assert metrics["rollout/reward/llm_judge/invalid"] == 3 and metrics["rollout/reward_errors"] == 0
    assert step_metrics([metrics, metrics])["rollout/reward/llm_judge/invalid"] == 6  # a count: summed


def test_an_engine_or_device_it_cannot_use_is_refused_at_startup():
    from relax_core.host.plugins import default_registry
    from relax_core.stages.rewarding import RewardSetupError, resolve_scorers

    reg = default_registry()
    import torch

    cases = [("nope", "cpu", "unknown engine 'nope'"), ("sglang", "cpu", "cannot run on --llm-judge-device cpu")]
    if not torch.cuda.is_available():
        cases.append(("hf", "cuda", "no CUDA device is visible"))
    for engine, device, why in cases:
        cfg = RunConfig(reward=("llm_judge",), plugin_params={"llm_judge": LLMJudgeParams(engine=engine, device=device)})
        with pytest.raises(RewardSetupError, match=why):
            resolve_scorers(cfg, reg)


def test_entry_point():
    eps = {ep.name: ep.value for ep in md.entry_points(group="relax.plugins")}
    assert eps.get("llm_judge") == "relax_llm_judge.plugin"


def test_dry_run_exits_2_naming_the_engine_and_device():
    from typer.testing import CliRunner

    from cli.main import app

    r = CliRunner().invoke(app, ["train", "--dry-run", "--reward", "llm_judge", "--llm-judge-engine", "sglang",
                                 "--data", "rg:chain_sum?size=4", "--eval-data", "none"])
    assert r.exit_code == 2, r.output
    assert "--llm-judge-engine sglang cannot run on --llm-judge-device cpu (its devices: cuda)" in r.output
