"""`relax eval` end to end on a tiny random model: greedy samples agree one for one with a
plain transformers `generate` loop scored by the same scorer; the files it writes; bad
input gives one line and exit 2 before any model loads."""

from __future__ import annotations

import json

import pytest
from conftest import run_train, tiny_args

from relax_e2e_scorers import vowel_fraction

SCORER = ["--custom-rm-path", "relax_e2e_scorers:vowel_fraction"]


def run_eval(args: list[str]) -> tuple[int, str]:
    from typer.testing import CliRunner

    from cli.main import app

    res = CliRunner().invoke(app, ["eval", *args])
    if res.exception and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res.exit_code, res.output


@pytest.fixture(scope="module")
def lively_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with its layer matrices redrawn at std 0.3: the 0.02 of the fixture
    leaves the residual stream at the input embedding, so greedy decoding repeats the
    prompt's last token ("\n") whatever the prompt; these respond differently per prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".layers." in name and p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    out = tmp_path_factory.mktemp("lively")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


def test_greedy_eval_agrees_with_a_plain_transformers_loop(lively_model_dir, prompts_file, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tiny_model_dir = lively_model_dir
    code, out = run_eval([str(tiny_model_dir), "--eval-data", f"p={prompts_file}", *SCORER,
                          "--eval-max-response-len", "8", "--max-prompts", "4", "--out", str(tmp_path),
                          "--no-bf16"])  # float32, as the transformers loop below
    assert code == 0, out
    samples = [json.loads(x) for x in (tmp_path / "eval_samples.jsonl").read_text().splitlines()]
    assert [(s["mode"], s["prompt_index"]) for s in samples] == [("greedy", i) for i in range(4)]

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    rows = [json.loads(x) for x in prompts_file.read_text().splitlines()][:4]
    expected = []
    for row in rows:  # one prompt at a time, no padding, transformers' own greedy search
        text = tok.apply_chat_template([{"role": "user", "content": row["prompt"]}], add_generation_prompt=True,
                                       tokenize=False)
        ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=8,
                                 pad_token_id=tok.pad_token_id)
        response = tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)
        expected.append((response, vowel_fraction(response, row["label"], {})))
    assert [s["response"] for s in samples] == [r for r, _ in expected]
    assert [s["reward"] for s in samples] == pytest.approx([r for _, r in expected], rel=1e-6)  # float32 rewards
    assert len({r for r, _ in expected}) > 1  # the prompts lead to different responses: the check can fail

    report = json.loads((tmp_path / "eval.json").read_text())
    greedy = report["sets"]["p"]["greedy"]
    assert greedy["reward_mean"]["mean"] == pytest.approx(sum(r for _, r in expected) / 4)
    assert greedy["pass@1"]["mean"] == 0.0  # vowel fractions of a random model stay below 1
    assert "relax eval: " in out and "pass@1" in out and "reward_mean" in out


def test_sampled_metrics_files_and_settings(tiny_model_dir, prompts_file, tmp_path):
    code, out = run_eval([str(tiny_model_dir), "--eval-data", f"p={prompts_file}", *SCORER, "--n-samples", "3",
                          "--pass-k", "1", "--pass-k", "3", "--eval-temperature", "1.5", "--eval-top-p", "0.9",
                          "--eval-max-response-len", "4", "--max-prompts", "2", "--out", str(tmp_path)])
    assert code == 0, out
    report = json.loads((tmp_path / "eval.json").read_text())
    s = report["settings"]
    assert (s["n_samples"], s["pass_k"], s["temperature"], s["top_p"], s["max_response_len"]) == (3, [1, 3], 1.5, 0.9, 4)
    assert report["model"] == str(tiny_model_dir) and "git_commit" in report
    res = report["sets"]["p"]
    assert (res["prompts"], res["rows"], res["scorers"]) == (2, 8, ["custom"])
    assert list(res["sampled"]) == ["accuracy", "pass@1", "pass@3", "reward_mean", "response_len", "truncated_ratio"]
    for e in res["sampled"].values():
        assert set(e) == {"mean", "se", "ci95_low", "ci95_high"}
    samples = [json.loads(x) for x in (tmp_path / "eval_samples.jsonl").read_text().splitlines()]
    sampled = [x for x in samples if x["mode"] == "sampled"]
    assert [x["prompt_index"] for x in sampled] == [0, 0, 0, 1, 1, 1]
    assert all(x["response_len"] <= 4 and set(x) >= {"prompt", "response", "answer", "label", "reward"} for x in samples)
    rewards = [x["reward"] for x in sampled]
    assert res["sampled"]["reward_mean"]["mean"] == pytest.approx(sum(rewards) / 6)


@pytest.mark.parametrize("args, message", [
    (["no/such/model-dir"], "not a local directory"),
    (["MODEL", "--n-samples", "2", "--pass-k", "3"], "--pass-k 3: needs 1 <= k <= --n-samples (2)"),
    (["MODEL", "--checkpoint", "step_2"], "--checkpoint step_2 needs a run directory"),
    (["MODEL", "--eval-data", "x=zz:nothing"], "unknown data source 'zz:'"),
    (["MODEL", "--eval-data", "a=DATA", "--eval-data", "a=DATA"], "two sets are named 'a'"),
    (["RUN"], "has no final/ model"),
    (["RUN", "--checkpoint", "7"], "--checkpoint 7: no checkpoint"),
])
def test_bad_input_one_line_exit_2(args, message, tiny_model_dir, prompts_file, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run_info.json").write_text("{}")
    (run / "config.json").write_text(json.dumps({"model": str(tiny_model_dir)}))
    sub = {"MODEL": str(tiny_model_dir), "DATA": str(prompts_file), "RUN": str(run)}
    code, out = run_eval([sub.get(a, a).replace("DATA", str(prompts_file)) for a in args] + SCORER)
    assert code == 2, out
    lines = [x for x in out.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("relax eval: error: ") and message in lines[0], out


def test_a_run_directory_final_and_its_checkpoints(tiny_model_dir, prompts_file, tmp_path):
    code, out = run_train(tiny_args(tiny_model_dir, prompts_file, tmp_path, "--save-interval", "1", "--lr", "5e-2"))
    assert code == 0, out
    run = tmp_path / "run"
    responses = {}
    for extra, where in (([], "final"), (["--checkpoint", "2"], "step_000002"), (["--checkpoint", "step_000001"],
                                                                                "step_000001")):
        code, out = run_eval([str(run), "--eval-data", f"p={prompts_file}", *SCORER, "--max-prompts", "4",
                              "--eval-max-response-len", "8", *extra])
        assert code == 0, out
        # the set is the run's own training file: said, not refused
        assert f"--eval-data p: 8 of its 8 prompts are among the run's training rows (--data {prompts_file})" in \
            " ".join(out.split()), out
        assert json.loads((run / "eval" / where / "eval.json").read_text())["target"] == f"run/{where}"
        samples = (run / "eval" / where / "eval_samples.jsonl").read_text().splitlines()
        responses[where] = [json.loads(x)["response"] for x in samples]
    # the final model is the trainer's weights after step 2: the step-2 checkpoint's, loaded over the base model
    assert responses["final"] == responses["step_000002"]
    assert responses["step_000002"] != responses["step_000001"]  # the checkpoint's weights were loaded (lr 5e-2 moves them)
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"prompt": f"What is {i} - 1?", "label": str(i - 1)}) + "\n" for i in range(4)))
    code, out = run_eval([str(run), "--eval-data", f"o={other}", *SCORER, "--eval-max-response-len", "8"])
    assert code == 0 and "training rows" not in out, out


def test_a_scorer_that_fails_its_own_labels_is_refused_before_the_model_loads(tiny_model_dir, prompts_file):
    # relax train's label check: the correct label as the response must score; a constant 0 does not
    code, out = run_eval([str(tiny_model_dir), "--eval-data", f"p={prompts_file}",
                          "--custom-rm-path", "relax_e2e_scorers:always_zero"])
    assert code == 2 and "relax eval: error: " in out and "a correct answer cannot score" in out, out


def test_a_pure_distillation_run_evaluates_with_the_task_scorer_unweighted(lively_model_dir, prompts_file, tmp_path):
    """``--reward-weights 0`` (pure distillation) makes every training reward 0, but the
    held-out evaluation must score with the task's own scorer, unweighted, as ``relax eval``
    does (it once reported 0 % for a model at 17 %), and ``rollout/reward/<name>`` must log the
    unweighted task reward of the training samples; the rewards are 0 by design, so the
    run does not warn that they carry no signal."""
    code, out = run_train(tiny_args(lively_model_dir, prompts_file, tmp_path, "--num-rollout", "1",
                                    "--correction", "opd", "--teacher-model", str(lively_model_dir),
                                    "--reward-weights", "0", "--eval-data", f"p={prompts_file}", "--eval-interval",
                                    "1", "--eval-max-prompts", "4", "--eval-max-response-len", "8",
                                    "--no-exclude-eval-prompts"))
    assert code == 0, out
    assert "every sample of the first" not in out  # rewards 0 by design: no "no signal" warning
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    before = next(r for r in rows if r["step"] == 0 and "eval/p/reward_mean" in r)
    code, out = run_eval([str(lively_model_dir), "--eval-data", f"p={prompts_file}", *SCORER,
                          "--eval-max-response-len", "8", "--max-prompts", "4", "--out", str(tmp_path / "eval"),
                          "--no-bf16"])  # float32, as the run
    assert code == 0, out
    greedy = json.loads((tmp_path / "eval" / "eval.json").read_text())["sets"]["p"]["greedy"]
    assert greedy["reward_mean"]["mean"] > 0.05  # vowel fractions: the check can fail
    assert before["eval/p/reward_mean"] == pytest.approx(greedy["reward_mean"]["mean"], rel=1e-6)
    step = next(r for r in rows if "train/loss" in r)
    assert step["rollout/raw_reward"] == 0.0  # the weighted sum the estimator sees
    task = [v for k, v in step.items() if k.startswith("rollout/reward/")]
    assert len(task) == 1 and task[0] > 0.05, step
