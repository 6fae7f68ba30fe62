"""Environments end to end on the hf engine and a tiny random model: for every built-in
environment the trained token ids are the sampled ones, every loss_mask-1 token carries the
engine's rollout log-prob (equal to a teacher-forced forward of the trained sequence), the
engine continued from exact prefixes of it (between the turns, tools: calculator and sandboxed
python results; gymnasium: FrozenLake's replies); `retry`, `tools` and `gymnasium` train 2 steps."""

from __future__ import annotations

import json
import math
import multiprocessing as mp

import pytest
import torch
from conftest import run_train, tiny_args

from relax_core.contracts import SamplingParams
from relax_core.environments import EPISODE_ENDS, Reply, Turn
from relax_core.host.plugins import default_registry
from relax_core.reporting.metrics import read_metrics
from relax_core.stages.env_host import ThreadHost
from relax_core.stages.episodes import EpisodeRunner, ReplyRenderer

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*(3+4)"}}</tool_call>'
PYTHON_CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>'


class Recording:
    """The engine, recording every call's contexts and outputs."""

    def __init__(self, engine):
        self.engine, self.tokenizer, self.calls = engine, engine.tokenizer, []

    def generate(self, prompt_ids, sampling):
        out = self.engine.generate(prompt_ids, sampling)
        self.calls.append(([list(p) for p in prompt_ids], out))
        return out


class CallingEpisode:
    """A tools episode whose model turns all read as a calculator call (a random model writes
    none), so that tool results are rendered between real sampled turns."""

    def __init__(self, episode, call=CALL):
        self.episode, self.call = episode, call

    def step(self, turn: Turn) -> Reply:
        return self.episode.step(Turn(text=turn.text + self.call, index=turn.index, score=turn.score))


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from relax_hf.engine import HFEngine

    return HFEngine(str(tiny_model_dir), seed=0)


@pytest.mark.parametrize("name, tool", [("single_turn", None), ("retry", None), ("tools", "calculator"),
                                        ("tools", "python"), ("gymnasium", None)])
def test_trained_ids_are_the_sampled_ids(name, tool, engine):
    reg = default_registry()
    if name not in reg.names("environment"):
        pytest.skip(f"environment {name} not installed")
    spec = reg.get("environment", name).spec
    if tool == "python" and spec.params(use="python").problems():
        pytest.skip(f"no python sandbox here: {spec.params(use='python').problems()}")
    env = spec.build(spec.params(use=tool)) if tool else spec.build()
    if name == "tools":  # the sandboxed python tool's output comes back as tool tokens, like the calculator's
        call = CALL if tool == "calculator" else PYTHON_CALL
        tools, env = env, type("Calling", (), {"start": lambda self, row: CallingEpisode(tools.start(row), call)})()
    caps = reg.get("environment", name).spec.capabilities_for()
    rec = Recording(engine)
    score = (lambda texts, *rest: ([0.0] * len(texts), {})) if caps.scores_turns else None  # always wrong: retry
    runner = EpisodeRunner(rec, ReplyRenderer(engine.tokenizer, True), max_turns=3 if caps.multi_turn else 1,
                           max_episode_tokens=None, score=score, pad_token_id=engine.pad_token_id,
                           host=ThreadHost(env, 60.0, 4))
    prompts = [engine.tokenizer(engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": f"What is {i} + 1?"}], tokenize=False, add_generation_prompt=True),
        add_special_tokens=False)["input_ids"] for i in (1, 1, 2)]  # a group of two, and one more
    out = runner.generate([{"prompt": "", "label": "2", "metadata": {}}] * 3, [""] * 3, prompts,
                          SamplingParams(temperature=1.0, max_new_tokens=6, seed=5, stop=("e",)))
    turns = out.num_turns.tolist()
    if caps.multi_turn:  # else the test would not test the bookkeeping
        assert out.env_mask.any() and max(turns) > 1, turns
    for b in range(3):
        mask, n = out.loss_mask[b], int(out.response_lengths[b])
        sampled, logq = [], []
        for k, (contexts, call) in enumerate(rec.calls):
            active = [i for i in range(3) if turns[i] > k]
            if b not in active:
                continue
            j = active.index(b)
            # the engine continued from exactly the trained sequence's prefix: nothing re-tokenised
            assert contexts[j] == prompts[b] + out.response_ids[b, :len(contexts[j]) - len(prompts[b])].tolist()
            m = int(call.response_lengths[j])
            sampled += call.response_ids[j, :m].tolist()
            logq += call.rollout_log_probs[j, :m].tolist()
        assert out.response_ids[b][mask].tolist() == sampled  # trained ids == sampled ids
        assert out.rollout_log_probs[b][mask].tolist() == logq  # every model token: the engine's log q
        assert not (mask & out.env_mask[b]).any() and bool((mask | out.env_mask[b])[:n].all())
        # teacher-forced log-probs of the whole trained sequence equal the engine's at the model tokens
        ids = torch.tensor([prompts[b] + out.response_ids[b, :n].tolist()])
        with torch.no_grad():
            logits = engine.model(input_ids=ids).logits[0, len(prompts[b]) - 1:-1].float()
        forced = logits.log_softmax(-1).gather(1, ids[0, len(prompts[b]):, None]).squeeze(1)
        torch.testing.assert_close(forced[mask[:n]], out.rollout_log_probs[b, :n][mask[:n]], atol=2e-4, rtol=0)
        assert EPISODE_ENDS[int(out.episode_end[b])] in EPISODE_ENDS
        if name == "tools" and turns[b] > 1:
            result = "42\n" if tool == "python" else "84"  # print(6 * 7) in the sandbox; 12*(3+4)
            assert f"<|im_start|>tool\n{result}<|im_end|>" in out.transcripts[b], out.transcripts[b]


# a random model almost never samples EOS: the stop string "e" ends its turns early (the host
# then closes each turn itself), so that episodes have several turns
@pytest.mark.parametrize("name, extra", [("retry", ["--max-turns", "3", "--calculate-per-token-loss",
                                                    "--rollout-stop", "e"]),
                                         ("tools", ["--max-turns", "2"]),
                                         ("gymnasium", ["--max-turns", "2", "--rollout-stop", "e"])])
def test_multi_turn_environment_trains_two_steps(name, extra, tiny_model_dir, prompts_file, tmp_path):
    if name not in default_registry().names("environment"):
        pytest.skip(f"environment {name} not installed")
    code, out = run_train(tiny_args(tiny_model_dir, prompts_file, tmp_path, "--environment", name, *extra,
                                    "--no-save-hf", "--eval-data", "none"))
    assert code == 0, out
    recs = read_metrics(tmp_path / "run")
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        assert math.isfinite(r["train/loss"]) and r["train/skipped_steps"] == 0.0
        ends = sum(r[f"rollout/episode_end/{e}"] for e in EPISODE_ENDS)
        assert ends == pytest.approx(1.0)
        assert 1 <= r["rollout/num_turns/mean"] <= r["rollout/num_turns/max"] <= int(extra[1])
    if name == "retry":  # vowel-fraction scores are below 1 (wrong): most episodes retry, with feedback tokens
        assert recs[0]["rollout/num_turns/mean"] > 1 and recs[0]["rollout/env_token_frac"] > 0
        samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
        several = [r for r in samples if r.get("num_turns", 1) > 1]
        assert several and all("Your answer is not correct, try again." in r["transcript"] for r in several)


def test_a_failing_prompt_stops_the_run_with_exit_7(tiny_model_dir, prompts_file, tmp_path, monkeypatch):
    """An environment whose ``prompt(text)`` raises: relax train stops at its first step with
    exit 7, the environment and the prompt named, and no traceback."""
    if "tools" not in default_registry().names("environment"):
        pytest.skip("environment tools not installed")
    from relax_tools.tools import Tools

    def broken(self, text):
        raise KeyError("no tools for this row")

    monkeypatch.setattr(Tools, "prompt", broken)
    code, out = run_train(tiny_args(tiny_model_dir, prompts_file, tmp_path, "--environment", "tools",
                                    "--no-save-hf", "--eval-data", "none"))
    assert code == 7, out
    assert "environment 'tools': prompt() failed on the prompt" in out and "KeyError: 'no tools for this row'" in out
    assert "fix the environment, then start again" in out and "Traceback" not in out


def test_process_isolation_trains_the_same_as_threads(tiny_model_dir, prompts_file, tmp_path):
    """--env-isolation process (episodes in spawned workers) gives the thread host's run value
    for value: the same episodes, rewards, losses (timings aside)."""
    runs = {}
    for iso in ("thread", "process"):
        code, out = run_train(tiny_args(tiny_model_dir, prompts_file, tmp_path / iso, "--environment", "retry",
                                        "--max-turns", "3", "--rollout-stop", "e", "--env-isolation", iso,
                                        "--no-save-hf", "--eval-data", "none"))
        assert code == 0, out
        assert not [p for p in mp.active_children() if p.name == "relax-env-worker"]  # the run closed its host
        runs[iso] = [{k: v for k, v in r.items() if not k.startswith(("perf/", "time/")) and "_time" not in k}
                     for r in read_metrics(tmp_path / iso / "run")]
    assert runs["thread"][0]["rollout/num_turns/mean"] > 1  # several turns: the workers were stepped
    assert runs["process"] == runs["thread"]
